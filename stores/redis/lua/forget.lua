-- Delete KEYS[1] if it holds a done record, or anything when ARGV[1] is
-- "1" (force). Returns false if the key does not exist, else
-- {value, remaining ttl in ms, 1 if deleted else 0}.
local v = redis.call('GET', KEYS[1])
if not v then
	return false
end
local ttl = redis.call('PTTL', KEYS[1])
if ARGV[1] == '1' or string.sub(v, 1, 5) == 'done:' then
	redis.call('DEL', KEYS[1])
	return {v, ttl, 1}
end
return {v, ttl, 0}
