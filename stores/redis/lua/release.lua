-- Delete KEYS[1] if it still holds the lease ARGV[1] ("inflight:<token>"),
-- as it is or with its mark's suffix, live or run out: the lease's owner
-- knows its fate now, and a released lease leaves no mark. Returns 1 if
-- deleted, 0 if not ours (taken over, done or absent).
local v = redis.call('GET', KEYS[1])
if v and (v == ARGV[1] or string.match(v, '^(.-);mark=%d') == ARGV[1]) then
	return redis.call('DEL', KEYS[1])
end
return 0
