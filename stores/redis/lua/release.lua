-- Delete KEYS[1] if it still holds the in-flight value ARGV[1].
-- Returns 1 if deleted, 0 if not ours (expired, taken over or done).
if redis.call('GET', KEYS[1]) == ARGV[1] then
	return redis.call('DEL', KEYS[1])
end
return 0
