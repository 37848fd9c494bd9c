-- Delete KEYS[1] if it still holds the lease ARGV[1] ("inflight:<token>"),
-- as it is or with its mark's suffix, live or run out: the lease's owner
-- knows its fate now, and a released lease leaves no mark. Returns 1 if
-- deleted, 2 if absent (nothing holds the key: above all this release's
-- own first sending, whose reply was lost, deleted it), 0 if another
-- value holds it (taken over, or done).
local v = redis.call('GET', KEYS[1])
if not v then
	return 2
end
if v == ARGV[1] or string.match(v, '^(.-);mark=%d') == ARGV[1] then
	return redis.call('DEL', KEYS[1])
end
return 0
