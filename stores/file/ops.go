package file

import (
	"context"
	"fmt"
	"time"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/storepool"
)

// Claim implements Store. The database holds done records; leases are
// claimed in memory and written through to the database, synced before
// Claim returns (see shared).
func (s *Store) Claim(_ context.Context, key, token string, ttl time.Duration) (dedup.ClaimResult, string, error) {
	if s.users.Closed() {
		// A delivery that reached a config already cleaned up: its
		// commit could not land (see Users.Closed).
		return 0, "", fmt.Errorf("file store: %w", storepool.ErrUnloaded)
	}
	st, err := s.st()
	if err != nil {
		return 0, "", err
	}
	// A new event's lookup costs the memtables and one bloom filter per
	// level (per L0 sublevel), the last level's too (see lookup); a
	// duplicate reads its record (its value carries the fingerprint).
	settles := st.leases.Settles(key)
	if val, done, err := st.read(key); err != nil || done {
		return dedup.AlreadyDone, val, err
	}
	if claimReadHook != nil {
		claimReadHook(key)
	}
	res, val, wrote, err := st.leases.Take(key, token, ttl)
	if err != nil || (res != dedup.Claimed && res != dedup.Reclaimed) {
		return res, val, err
	}
	// A store closed meanwhile (its config cleaned up and its last
	// delivery done) refuses the claim: its commit could not land, and
	// an event processed without its record would be processed again.
	if st.isClosed() {
		_ = st.leases.Untake(key, token) // its lease goes, a mark it took over comes back
		return 0, "", errFileClosed
	}
	// A commit puts its record in the database before it drops its
	// lease: if one did both since the lookup above, it is there now.
	// Only a record that landed since the lookup can be there now, and
	// it is counted from before it can be read until after its Settle
	// (Table.SettledSince); else the lookup stands. Asked once the
	// lease is ours in memory, before its sync: a record that starts
	// landing after that was not in this claim's way. One landing then
	// may not be on disk yet (its batch held by the disk): read once
	// more after the sync, which completes after that batch.
	mayHaveLanded := st.leases.SettledSince(key, settles)
	if mayHaveLanded {
		if val, done, err := st.read(key); err != nil || done {
			return st.claimFoundDone(key, token, val, err)
		}
	}
	if wrote {
		if err := st.leases.Sync(); err != nil {
			// Not durable: the claim failed.
			_ = st.leases.Untake(key, token) // its lease goes, a mark it took over comes back
			return 0, "", err
		}
	}
	if mayHaveLanded && wrote { // no sync, nothing new to find
		if val, done, err := st.read(key); err != nil || done {
			return st.claimFoundDone(key, token, val, err)
		}
	}
	return res, val, nil
}

// claimFoundDone releases the lease of a claim that found key's done
// record (val) after taking it, or undoes the claim if it failed to
// read (err).
func (st *shared) claimFoundDone(key, token, val string, err error) (dedup.ClaimResult, string, error) {
	if err != nil {
		_ = st.leases.Untake(key, token) // its lease goes, a mark it took over comes back
		return 0, "", err
	}
	_, _ = st.leases.Release(key, token)
	return dedup.AlreadyDone, val, nil
}

// claimReadHook, when set (by a test), runs in Claim between the lookup
// of the record and the claim of the lease.
var claimReadHook func(key string)

// Renew implements Store.
func (s *Store) Renew(_ context.Context, key, token string, ttl time.Duration) (bool, error) {
	st, err := s.st()
	if err != nil {
		return false, err
	}
	return st.leases.Renew(key, token, ttl)
}

// Commit implements Store: the done record is on disk when it returns;
// then the lease is dropped.
func (s *Store) Commit(_ context.Context, key, token string, rec dedup.DoneRecord, retention time.Duration) (bool, error) {
	st, err := s.st()
	if err != nil {
		return false, err
	}
	enc := newDoneValue(rec)
	// Until the record is on disk the event stays leased, however long
	// the disk takes (the lease is dropped once the record lands, or
	// expires after the commit retries give up): a redelivery meanwhile
	// gets 409, never a second processing.
	st.leases.Extend(key, token, dedup.DrainFor)
	var again, held, released bool
	err = st.writeRecordThen(key, func(tx *txn) error {
		var once bool
		if held, once = st.leases.HoldsOnce(key, token); held {
			// The lease is still ours, so no attempt of this commit
			// landed (its landing drops the lease, in this order): no
			// record of ours to find. The lease leaves the disk with
			// the record's write, in the same batch.
			if err := tx.set(key, enc, retention); err != nil {
				return err
			}
			return deleteLease(tx.b, key, once)
		}
		var err error
		again, err = tx.replace(key, enc, retention) // a retried commit whose first attempt landed
		return err
	}, func() {
		// Dropped by the writer as soon as the record is on disk, in
		// order with the other writes, even if this caller gave up
		// waiting: a forget that follows finds the record, not a lease.
		// A mark there (an earlier attempt's) is replaced too.
		if held {
			released, _ = st.leases.SettleWritten(key, token)
		} else {
			released, _ = st.leases.Settle(key, token)
		}
	})
	if err != nil {
		return false, err
	}
	return released || again, nil
}

// Release implements Store.
func (s *Store) Release(_ context.Context, key, token string) (bool, error) {
	st, err := s.st()
	if err != nil {
		return false, err
	}
	return st.leases.Release(key, token)
}

// Get implements Store: the lease in memory, else the record on disk.
func (s *Store) Get(_ context.Context, key string) (dedup.Entry, error) {
	st, err := s.st()
	if err != nil {
		return dedup.Entry{}, err
	}
	if e, ok := st.leases.Lookup(key); ok {
		return e, nil
	}
	return st.entry(key)
}

// Forget implements Store: a done record is deleted from the database
// (on disk when Forget returns); a lease or a mark, with force, from
// memory and the database (synced), and the record too.
//
// Both go through the writer, after every write queued before: the
// write of a commit that a stalled disk holds (its caller gave up
// waiting, its lease kept) lands before the forget, never after it. If
// the disk does not take the forget in time, it is an error: nothing
// was forgotten if the writer had not taken it yet (errFileStalled);
// else it may still be applied when the disk answers
// (errFileWritePending, which says so).
func (s *Store) Forget(_ context.Context, key string, force bool) (dedup.Entry, bool, error) {
	st, err := s.st()
	if err != nil {
		return dedup.Entry{}, false, err
	}
	if !force {
		if e, ok := st.leases.Lookup(key); ok {
			return e, false, nil // in flight
		}
	}
	var rec, lease dedup.Entry
	var leaseErr error
	err = st.writeThen(func(tx *txn) error {
		var err error
		rec, err = tx.forget(key)
		return err
	}, func() {
		if force {
			lease, _, leaseErr = st.leases.Forget(key, true)
		}
	})
	if err == nil {
		err = leaseErr
	}
	if err == nil && lease.Value != "" {
		err = st.syncLeases() // an operator's forget is durable
	}
	switch {
	case err != nil:
		return dedup.Entry{}, false, err
	case lease.Value != "":
		return lease, true, nil
	}
	return rec, rec.Value != "", nil
}

// Entries returns the number of done records in the store, including
// expired ones that the sweeper has not deleted yet. It reads every
// record's key: for tests and benchmarks, not for a request.
func (s *Store) Entries() (int, error) {
	st, err := s.st()
	if err != nil {
		return 0, err
	}
	return st.count(prefixDone)
}
