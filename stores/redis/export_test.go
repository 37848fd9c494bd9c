package redis

// CheckRetryEvery is how long a refused permission check is remembered
// before the next operation checks again.
const CheckRetryEvery = checkRetryEvery
