package sanghodedup

import (
	"sync"
	"time"

	"go.uber.org/zap"
)

// sigRejectEvery is the least time between two "signatures rejected"
// lines of one handler.
const sigRejectEvery = 10 * time.Second

// sigRejectLog logs rejected signatures at warn, sampled, so that an
// operator sees a wrong secret or a forger at the default log level
// while a flood of forged requests cannot flood the log: the first
// rejection after a quiet spell is logged at once; the ones that follow
// within `every` are counted, and one line when `every` has passed
// gives their count and the facts of the latest. One line per `every`
// at most, plus the one Cleanup writes for what is pending; every
// rejection is in a line's count, and each is also logged at debug
// ("delivery rejected") and counted in
// caddy_sangho_dedup_signature_failures_total.
type sigRejectLog struct {
	every  time.Duration
	logger *zap.Logger

	mu      sync.Mutex
	last    time.Time   // when the last line was written
	pending int64       // rejections not in a line yet
	latest  []zap.Field // the facts of the latest of them
	timer   *time.Timer // writes the pending line when every has passed
	stopped bool
}

func (s *sigRejectLog) note(fields ...zap.Field) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now() // after the lock: lines are at least every apart
	s.pending++
	s.latest = fields
	if s.timer != nil || s.stopped {
		return
	}
	if wait := s.last.Add(s.every).Sub(now); wait > 0 {
		s.timer = time.AfterFunc(wait, s.flush)
		return
	}
	s.writeLocked()
}

func (s *sigRejectLog) flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.timer = nil
	if s.pending > 0 && !s.stopped {
		s.writeLocked()
	}
}

// writeLocked writes the pending line. The next may come every after
// the moment this one is written, taken once it is (the line's own time
// is taken after any wait before the write: a window counted from
// before it could put the next line less than every after this one).
func (s *sigRejectLog) writeLocked() {
	s.logger.Warn("signatures rejected", append([]zap.Field{zap.Int64("count", s.pending),
		zap.Duration("every", s.every)}, s.latest...)...)
	s.pending, s.latest, s.last = 0, nil, time.Now()
}

// stop writes the pending line and stops the timer: the handler is
// being unloaded.
func (s *sigRejectLog) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	if s.pending > 0 && !s.stopped {
		s.writeLocked()
	}
	s.stopped = true
}
