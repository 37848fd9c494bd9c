package sanghodedup

import (
	"context"
	"maps"
	"reflect"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// retryCommit keeps trying to write the done record of an event the
// backend processed. Writing it late is always right: the event was
// processed, and if another delivery claimed it meanwhile (our lease
// expired during a long store outage), that delivery's own commit writes
// the same fact and its release cannot delete a done record. Retries are
// frequent (at most every 250 ms) so that the record lands soon after
// the store is back, before Sangho's next redelivery, and they stop
// after dedup.CommitRetryFor. A record written after the lease expired, or
// never, is logged at error level; never is counted in
// caddy_sangho_dedup_commit_errors_total. An operator's forget of the
// event stops them (see Handler.forget): the record is not written back.
func (d *delivery) retryCommit(rec dedup.DoneRecord, cr *commitRetry) {
	h := d.h
	deadline := time.Now().Add(dedup.CommitRetryFor)
	backoff := 50 * time.Millisecond
	for tries := 1; time.Now().Before(deadline); tries++ {
		time.Sleep(backoff)
		backoff = min(2*backoff, 250*time.Millisecond)
		stopped, err := cr.attempt(func() error {
			ctx, cancel := context.WithTimeout(d.ctx, 5*time.Second)
			defer cancel()
			_, err := d.commitAll(ctx, rec)
			return err
		})
		if stopped {
			h.logger.Info("commit stopped", zap.String("event_id", d.id), zap.String("cause", "event forgotten"))
			return
		}
		if err != nil {
			continue
		}
		if time.Now().After(d.lease.expiry()) {
			h.logger.Error("commit retried after lease expired", zap.String("event_id", d.id), zap.Int("retries", tries))
		} else {
			h.logger.Info("commit retried", zap.String("event_id", d.id), zap.Int("retries", tries))
		}
		return
	}
	metrics.commitErr.Inc()
	h.logger.Error("commit abandoned", zap.String("event_id", d.id), zap.Duration("tried_for", dedup.CommitRetryFor))
}

// commitRetries are the commits of this process, under way or retried
// in the background, by the store data (its DataID) and key they write: a forget
// of the event stops them, or one would write the forgotten record back.
var commitRetries = retryRegistry{m: map[retryKey]*commitRetry{}}

type retryRegistry struct {
	mu sync.Mutex
	m  map[retryKey]*commitRetry // the first of a chain (next)
}

type retryKey struct{ data, key string }

// commitRetry is one event's commit and its background retries.
type commitRetry struct {
	rk      retryKey
	next    *commitRetry // another commit of the same key (rare)
	mu      sync.Mutex   // held during an attempt, and by a forget
	stopped bool
}

func (r *retryRegistry) add(data, key string) *commitRetry {
	cr := &commitRetry{rk: retryKey{data, key}}
	r.mu.Lock()
	cr.next = r.m[cr.rk]
	r.m[cr.rk] = cr
	r.mu.Unlock()
	return cr
}

func (r *retryRegistry) remove(cr *commitRetry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if first := r.m[cr.rk]; first == cr {
		if cr.next == nil {
			delete(r.m, cr.rk)
		} else {
			r.m[cr.rk] = cr.next
		}
	} else {
		for c := first; c != nil; c = c.next {
			if c.next == cr {
				c.next = cr.next
				break
			}
		}
	}
}

// pending reports whether a commit of key in data is registered.
func (r *retryRegistry) pending(data, key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m[retryKey{data, key}] != nil
}

// hold waits for the attempts in flight of the commits of key in any
// of datas (one store's data, by each of its IDs) and keeps new ones
// from starting until the returned function is called with whether
// they are to stop.
func (r *retryRegistry) hold(datas []string, key string) func(stop bool) {
	var list []*commitRetry
	r.mu.Lock()
	for _, data := range slices.Compact(slices.Sorted(slices.Values(datas))) {
		for c := r.m[retryKey{data, key}]; c != nil; c = c.next {
			list = append(list, c)
		}
	}
	r.mu.Unlock()
	for _, cr := range list {
		cr.mu.Lock()
	}
	return func(stop bool) {
		for _, cr := range list {
			cr.stopped = cr.stopped || stop
			cr.mu.Unlock()
		}
	}
}

// attempt runs one try unless the retry was stopped.
func (cr *commitRetry) attempt(try func() error) (stopped bool, err error) {
	cr.mu.Lock()
	defer cr.mu.Unlock()
	if cr.stopped {
		return true, nil
	}
	return false, try()
}

// forget is the operators' forget (admin API) of key: it deletes the
// event's record (with force, its lease too) and stops this process's
// background commit retries of it, which would write the record back.
// They are held while the store forgets, and go on if nothing was
// forgotten because the event is in flight.
func (h *Handler) forget(ctx context.Context, key string, force bool) (dedup.Entry, bool, error) {
	datas := []string{h.storeData}
	if a, ok := h.store.(dedup.DataAliaser); ok {
		datas = append(datas, a.DataAliases()...)
	}
	release := commitRetries.hold(datas, key)
	e, deleted, err := h.store.Forget(ctx, key, force)
	release(err == nil && (deleted || e.Value == ""))
	return e, deleted, err
}

// Background commit retries live as long as the store they need (a
// reload keeps it open for them: each is a user of it, see Handler.enter
// and dedup.UseCounter), at most dedup.CommitRetryFor.
// When the process exits they get exitCommitGrace more to land; those
// still failing then are abandoned, logged and counted.
var (
	pendingCommits  = pendingSet{m: map[*zap.Logger]int64{}} // background commit retries of this process
	exitCommitGrace = 5 * time.Second
	onExitOnce      sync.Once
)

// pendingSet counts background commit retries by the logger of the
// handler that started them, so that the exit hook logs those it
// abandons through that handler's logger.
type pendingSet struct {
	mu sync.Mutex
	m  map[*zap.Logger]int64
}

func (p *pendingSet) add(logger *zap.Logger, n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m[logger] += n; p.m[logger] == 0 {
		delete(p.m, logger)
	}
}

// Load returns the number of retries pending, all handlers together.
func (p *pendingSet) Load() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int64
	for _, k := range p.m {
		n += k
	}
	return n
}

// byLogger returns the retries pending, by handler logger.
func (p *pendingSet) byLogger() map[*zap.Logger]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.m)
}

// drainCommitRetries is a process-exit callback (caddy.OnExit): it runs
// after Caddy stopped serving and cleaned the config up. Then it parks
// every store that has something to do at exit (dedup.ExitParker).
func drainCommitRetries(context.Context) {
	deadline := time.Now().Add(exitCommitGrace)
	for pendingCommits.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	for logger, n := range pendingCommits.byLogger() {
		metrics.commitErr.Add(float64(n))
		logger.Error("commit retries abandoned at exit", zap.Int64("events", n), zap.Duration("grace", exitCommitGrace))
	}
	parkAtExit()
}

// exitParkers holds, by type, a store of each type this process loaded
// that has something to do at exit (dedup.ExitParker): ParkAtExit acts
// on every resource of its type still open, so one of each type is
// enough, and the set stays bounded however many reloads there are.
var exitParkers = struct {
	sync.Mutex
	m map[reflect.Type]dedup.ExitParker
}{m: map[reflect.Type]dedup.ExitParker{}}

func noteExitParker(s dedup.Store) {
	if p, ok := s.(dedup.ExitParker); ok {
		exitParkers.Lock()
		exitParkers.m[reflect.TypeOf(p)] = p
		exitParkers.Unlock()
	}
}

// parkAtExit runs every ExitParker, once the commit retries are done.
func parkAtExit() {
	exitParkers.Lock()
	ps := slices.Collect(maps.Values(exitParkers.m))
	exitParkers.Unlock()
	for _, p := range ps {
		p.ParkAtExit()
	}
}
