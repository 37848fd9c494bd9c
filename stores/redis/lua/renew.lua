-- Extend the lease on KEYS[1] to ARGV[2] milliseconds if it still holds
-- the in-flight value ARGV[1]. Returns 1 if extended, 0 if not ours.
if redis.call('GET', KEYS[1]) == ARGV[1] then
	return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
