-- Claim KEYS[1] for the lease ARGV[1] ("inflight:<token>"), storing
-- ARGV[2] (the lease and its mark's suffix) for ARGV[3] ms (the lease's
-- time plus the mark's). Run when the plain claim (SET NX GET) found a
-- marked lease: a lease is live while the key's PTTL is more than its
-- mark's time, and a mark after that. Returns the result's digit
-- followed by the value found (none if absent): 0 claimed (absent, or our own lease: a retried claim, whose
-- lease starts again), 1 done, 2 in flight (another token's live lease,
-- or a lease of the previous release, live while it exists), 3 reclaimed
-- (another token's mark, now ours, stored with ';reclaimed' after the
-- mark so that a retried claim whose first attempt took it says 3 too).
local v = redis.call('GET', KEYS[1])
local res = 0
if v then
	if string.sub(v, 1, 5) == 'done:' then
		return '1' .. v
	end
	local lease, mark, rest = string.match(v, '^(.-);mark=(%d+)(.*)$')
	if not lease then
		if v ~= ARGV[1] then
			return '2' .. v
		end
	elseif lease ~= ARGV[1] then
		local ttl = redis.call('PTTL', KEYS[1])
		if ttl < 0 or ttl > tonumber(mark) then
			return '2' .. v
		end
		res = 3
	elseif rest == ';reclaimed' then
		res = 3
	end
end
if res == 3 then
	redis.call('SET', KEYS[1], ARGV[2] .. ';reclaimed', 'PX', ARGV[3])
else
	redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
return res .. (v or '')
