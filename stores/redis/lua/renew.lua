-- Extend the lease ARGV[1] ("inflight:<token>") on KEYS[1] to ARGV[2]
-- milliseconds if KEYS[1] still holds it live: as it is (a lease of
-- the previous release), or with its mark's suffix while the key's PTTL
-- is more than the mark's time (then the key lives ARGV[2] plus the
-- mark's time). Returns 1 if extended, 0 if not ours or run out.
local v = redis.call('GET', KEYS[1])
if not v then
	return 0
end
if v == ARGV[1] then
	return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
local lease, mark = string.match(v, '^(.-);mark=(%d+)')
if lease == ARGV[1] and redis.call('PTTL', KEYS[1]) > tonumber(mark) then
	return redis.call('PEXPIRE', KEYS[1], string.format('%d', tonumber(ARGV[2]) + tonumber(mark)))
end
return 0
