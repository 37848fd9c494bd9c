-- What KEYS[1] holds and its remaining time to live in milliseconds,
-- read atomically. Returns false if the key does not exist.
local v = redis.call('GET', KEYS[1])
if not v then
	return false
end
return {v, redis.call('PTTL', KEYS[1])}
