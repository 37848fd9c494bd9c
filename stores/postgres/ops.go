package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/storepool"
)

// statements are the store's SQL for one table. Every expiry counts
// from the server's clock (now(): the start of the statement's
// transaction, its group's when grouped, see group.go), so that
// instances with skewed clocks agree.
type statements struct {
	insert, claim, renew, commit, commitAny, release, get, forget string
	channel                                                       string // of forget notifications
	ddl                                                           []string
	oldIndex                                                      string // the index on expires_at of releases before HOT commits
	sweep, blocks                                                 string
}

// present is the rows a key holds: a live row, or a lease whose time
// ran out within dedup.MarkFor, kept as the mark of an attempt whose
// fate is unknown (its expires_at is the lease's own; see claim).
var present = fmt.Sprintf(`(expires_at > now() OR (lease_token IS NOT NULL AND expires_at > now() - %s))`, markFor)

// markFor is dedup.MarkFor as an SQL interval.
var markFor = fmt.Sprintf(`interval '%d microseconds'`, dedup.MarkFor.Microseconds())

// cols is what a statement returns of a row, in scanRow's order.
const cols = `lease_token, processed_at, event_type, fingerprint, message_event_id, expires_at`

// ttl as an interval from $n microseconds (saturating: the longest
// Duration is 292 years, well inside timestamptz).
func ttlExpr(n int) string {
	return fmt.Sprintf("now() + $%d::bigint * interval '1 microsecond'", n)
}

func newStatements(table string) statements {
	r := strings.NewReplacer("{t}", table, "{cols}", cols, "{present}", present, "{mark}", markFor)
	return statements{
		// A new event's claim: the seed's own statement, one key lookup
		// and no CTE. It inserts only where the key has no row at all
		// (live, expired or a mark), so a row it inserts is Claimed with
		// nothing to report. Any row there (ON CONFLICT, which also
		// waits for a concurrent insert of the key to commit or abort)
		// leaves it empty, and the claim statement below decides.
		insert: r.Replace(`INSERT INTO {t} (event_id, lease_token, expires_at) VALUES ($1, $2, ` + ttlExpr(3) + `)
ON CONFLICT (event_id) DO NOTHING RETURNING true`),
		// The claim of a key that has a row (insert changed nothing), in
		// one statement. cur reads the row as of the
		// statement's start; when it holds no live row, ins inserts a
		// lease, or takes over a row that expired (ON CONFLICT ... WHERE
		// expired, which sees the latest version of the row). A live row
		// is only read: no lock, no write, so a duplicate costs a read.
		// Under a race (a row inserted or renewed after the statement's
		// snapshot) neither part returns a row, and the claim runs again.
		//
		// Why two claimants never both get Claimed (read committed): a
		// claimant gets Claimed only from ins, that is either its INSERT
		// went in (the primary key admits one) or its DO UPDATE took the
		// row, which it does only holding the row lock and re-checking
		// WHERE on the row's latest committed version (EvalPlanQual), so
		// after one takeover commits the next claimant sees a live lease
		// and updates nothing. An empty answer is never a duplicate: it
		// is retried, and after maxClaimTries it is a store error. The
		// simpler "ON CONFLICT DO UPDATE always, RETURNING the row" would
		// need no retry but writes (and, with synchronous_commit, flushes
		// WAL) on every duplicate.
		//
		// Marks (dedup.MarkFor): a lease whose time ran out stays in its
		// row until the sweep deletes it, MarkFor after. When the claim
		// takes over such a row of another token, it returns that token
		// in the lease column of its "true" row: Reclaimed. The token is
		// read from cur, the row as of the statement's start; it can only
		// be stale if the owner released its lease in the instant between
		// (a mark then goes with a delivery that needed none: safe).
		claim: r.Replace(`WITH cur AS (
  SELECT {cols}, expires_at > now() AS live FROM {t} WHERE event_id = $1
), ins AS (
  INSERT INTO {t} AS e (event_id, lease_token, expires_at)
  SELECT $1, $2, ` + ttlExpr(3) + ` WHERE NOT EXISTS (SELECT 1 FROM cur WHERE live)
  ON CONFLICT (event_id) DO UPDATE
    SET lease_token = excluded.lease_token, expires_at = excluded.expires_at,
        processed_at = NULL, event_type = '', fingerprint = '', message_event_id = NULL
    WHERE e.expires_at <= now()
  RETURNING 1
)
SELECT true, (SELECT c.lease_token FROM cur c WHERE c.lease_token <> $2 AND c.expires_at > now() - {mark}),
  NULL::timestamptz, '', '', NULL::text, NULL::timestamptz FROM ins
UNION ALL
SELECT false, {cols} FROM cur WHERE live`),
		renew: r.Replace(`UPDATE {t} SET expires_at = ` + ttlExpr(3) + `
WHERE event_id = $1 AND lease_token = $2 AND expires_at > now()`),
		// A commit whose lease is still held (the usual case): one key
		// lookup and one HOT update, no CTE. held is whether it updated
		// the row. When it updates nothing (the lease ran out, was
		// taken over, released or swept, or this commit already landed
		// and its answer was lost), commitAny writes the done record
		// over whatever the key holds: the backend did process the
		// event.
		commit: r.Replace(`UPDATE {t} SET lease_token = NULL, processed_at = $4, event_type = $5, fingerprint = $6,
  message_event_id = NULLIF($7, ''), expires_at = ` + ttlExpr(3) + `
WHERE event_id = $1 AND lease_token = $2 AND expires_at > now()`),
		commitAny: r.Replace(`INSERT INTO {t} AS e (event_id, lease_token, processed_at, event_type, fingerprint, message_event_id, expires_at)
VALUES ($1, NULL, $3, $4, $5, NULLIF($6, ''), ` + ttlExpr(2) + `)
ON CONFLICT (event_id) DO UPDATE
  SET lease_token = NULL, processed_at = excluded.processed_at, event_type = excluded.event_type,
      fingerprint = excluded.fingerprint, message_event_id = excluded.message_event_id,
      expires_at = excluded.expires_at`),
		channel: forgetChannel(table),
		// The token's lease, live or a mark: a released lease leaves none.
		release: r.Replace(`DELETE FROM {t} WHERE event_id = $1 AND lease_token = $2 AND {present}`),
		get:     r.Replace(`SELECT {cols} FROM {t} WHERE event_id = $1 AND {present}`),
		forget: r.Replace(`WITH d AS (
  DELETE FROM {t} WHERE event_id = $1 AND {present} AND ($2 OR lease_token IS NULL)
  RETURNING {cols}
)
SELECT true, {cols} FROM d
UNION ALL
SELECT false, {cols} FROM {t} WHERE event_id = $1 AND {present} AND NOT EXISTS (SELECT 1 FROM d)`),
		// No index but the primary key: the commit changes no indexed
		// column, so PostgreSQL writes its new row version on the same
		// page without touching an index (a HOT update), and fillfactor
		// keeps room on every page for it. The sweep reads the table in
		// ranges of blocks instead (see sweepBatch).
		ddl: []string{
			r.Replace(`CREATE TABLE IF NOT EXISTS {t} (
  event_id         text        PRIMARY KEY,
  event_type       text        NOT NULL DEFAULT '',
  processed_at     timestamptz,
  fingerprint      text        NOT NULL DEFAULT '',
  message_event_id text,
  lease_token      text,
  expires_at       timestamptz NOT NULL,
  CHECK ((lease_token IS NULL) = (processed_at IS NOT NULL))
) WITH (fillfactor = ` + fillfactor + `)`),
		},
		oldIndex: oldIndex(table),
		// One batch: the expired rows of the blocks [$1, $2), found by a
		// TID range scan (it reads those blocks and no others, whatever
		// the table's statistics say), locked with SKIP LOCKED so that a
		// claim holding one keeps it, and checked again when deleted;
		// only if the sweep's advisory lock $3 was free (lock: taken once,
		// before any row, held to the end of the statement's own
		// transaction). One statement, one round trip: it answers whether
		// it held the lock and how many rows it deleted.
		sweep: r.Replace(`WITH lock AS MATERIALIZED (SELECT pg_try_advisory_xact_lock($3) AS got), d AS (
  DELETE FROM {t} WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM {t}
    WHERE (SELECT got FROM lock)
      AND ctid >= format('(%s,0)', $1::bigint)::tid AND ctid < format('(%s,0)', $2::bigint)::tid
      AND expires_at <= now() AND NOT {present}
    FOR UPDATE SKIP LOCKED
  )) AND expires_at <= now() AND NOT {present}
  RETURNING 1
)
SELECT (SELECT got FROM lock), (SELECT count(*) FROM d)`),
		blocks: r.Replace(`SELECT pg_relation_size('{t}') / current_setting('block_size')::bigint`),
	}
}

// fillfactor leaves a fifth of every page to the commits' new row
// versions, so that they stay on the lease's page (HOT).
const fillfactor = "80"

// oldIndex is the index on expires_at that releases before HOT commits
// created, as SQL: it made every commit write a new index entry.
func oldIndex(table string) string {
	i := strings.LastIndex(table, ".")
	name := strings.Trim(table[i+1:], `"`) + "_expires_at"
	if i < 0 {
		return `"` + name + `"`
	}
	return table[:i+1] + `"` + name + `"`
}

// row is a row as the statements return it.
type row struct {
	lease       *string
	processedAt *time.Time
	eventType   string
	fingerprint string
	messageID   *string
	expiresAt   *time.Time
}

func (r *row) dest() []any {
	return []any{&r.lease, &r.processedAt, &r.eventType, &r.fingerprint, &r.messageID, &r.expiresAt}
}

// value is the row as a dedup value: the lease, or the done record as
// DoneRecord.Encode renders it (processed_at to the microsecond, as
// PostgreSQL keeps it).
func (r *row) value() string {
	if r.lease != nil {
		return dedup.LeaseValue(*r.lease)
	}
	rec := dedup.DoneRecord{EventType: r.eventType, Fingerprint: r.fingerprint}
	if r.processedAt != nil {
		rec.ProcessedAt = r.processedAt.UTC()
	}
	if r.messageID != nil {
		rec.EventID = *r.messageID
	}
	return rec.Encode()
}

func (r *row) entry() dedup.Entry {
	e := dedup.Entry{Value: r.value()}
	if r.expiresAt != nil {
		e.ExpiresAt = *r.expiresAt
		// A mark, by this Caddy's clock: the claim itself judges by the
		// server's.
		e.Mark = r.lease != nil && !e.ExpiresAt.After(time.Now())
	}
	return e
}

func micros(d time.Duration) int64 { return d.Microseconds() }

// op runs f with the statement timeout, once the table check passed,
// and turns its error into the store's.
func (s *Store) op(ctx context.Context, f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, s.db.opts.timeout)
	defer cancel()
	if err := s.db.check.ensure(ctx, s.logger); err != nil {
		return err
	}
	err := f(ctx)
	if err == nil {
		return nil
	}
	return s.db.check.failed(ctx, err, s.logger)
}

var errPoolClosed = errors.New("postgres store: the pool is closed (its config was unloaded)")

// maxClaimTries bounds the reruns of a claim that raced (see claim).
const maxClaimTries = 5

// Claim implements dedup.Store.
func (s *Store) Claim(ctx context.Context, key, token string, ttl time.Duration) (dedup.ClaimResult, string, error) {
	if s.users.Closed() {
		// A delivery that reached a config already cleaned up: its
		// commit could not land (see Users.Closed).
		return 0, "", fmt.Errorf("postgres store: %w", storepool.ErrUnloaded)
	}
	var res dedup.ClaimResult
	var found string
	var ck string
	var gen uint64
	if c := s.db.cache; c != nil {
		ck = cacheKey(key)
		if val, ok := c.Get(ck); ok {
			return dedup.AlreadyDone, val, nil
		}
		gen = c.Generation()
	}
	err := s.op(ctx, func(ctx context.Context) error {
		// A new event: the insert only (see statements.insert), in the
		// group of the statements waiting with it (group.go).
		inserted, err := s.db.group.exec(ctx, key, s.db.sql.insert, true, key, token, micros(ttl))
		if err != nil {
			return err
		}
		if inserted {
			res, found = dedup.Claimed, ""
			return nil
		}
		// The key has a row: a duplicate, a lease (this token's own
		// included), an expired record or a mark.
		for range maxClaimTries {
			var claimed bool
			var r row
			err := s.db.pool.QueryRow(ctx, s.db.sql.claim, key, token, micros(ttl)).
				Scan(append([]any{&claimed}, r.dest()...)...)
			if errors.Is(err, pgx.ErrNoRows) {
				continue // raced: see statements.claim
			}
			if err != nil {
				return err
			}
			if claimed {
				res, found = dedup.Claimed, ""
				if r.lease != nil { // another token's mark, now ours
					res, found = dedup.Reclaimed, dedup.LeaseValue(*r.lease)
				}
				return nil
			}
			found = r.value()
			switch res = dedup.Classify(found, token); {
			case res == dedup.Claimed:
				// This token's live lease (a retried claim): it lives ttl
				// again, as the contract says; if it ran out or went
				// meanwhile, claim again.
				if s.db.beforeRenew != nil {
					s.db.beforeRenew()
				}
				tag, err := s.db.pool.Exec(ctx, s.db.sql.renew, key, token, micros(ttl))
				if err != nil {
					return err
				}
				if tag.RowsAffected() != 1 {
					continue
				}
				found = ""
			case res == dedup.AlreadyDone && s.db.cache != nil && r.expiresAt != nil:
				s.db.cache.Put(ck, found, expiresAt(s.db.cache, *r.expiresAt), gen)
			}
			return nil
		}
		return errors.New("postgres store: claim raced with other writers too many times")
	})
	return res, found, err
}

// Renew implements dedup.Store.
func (s *Store) Renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	var ok bool
	err := s.op(ctx, func(ctx context.Context) error {
		tag, err := s.db.pool.Exec(ctx, s.db.sql.renew, key, token, micros(ttl))
		ok = err == nil && tag.RowsAffected() == 1
		return err
	})
	return ok, err
}

// Commit implements dedup.Store.
func (s *Store) Commit(ctx context.Context, key, token string, rec dedup.DoneRecord, retention time.Duration) (bool, error) {
	var held bool
	err := s.op(ctx, func(ctx context.Context) error {
		at := rec.ProcessedAt.UTC()
		// In the group of the statements waiting with it (group.go).
		var err error
		held, err = s.db.group.exec(ctx, key, s.db.sql.commit, false, key, token, micros(retention),
			at, rec.EventType, rec.Fingerprint, rec.EventID)
		if err != nil || held {
			return err
		}
		_, err = s.db.pool.Exec(ctx, s.db.sql.commitAny, key, micros(retention),
			at, rec.EventType, rec.Fingerprint, rec.EventID)
		return err
	})
	return held, err
}

// Release implements dedup.Store.
func (s *Store) Release(ctx context.Context, key, token string) (bool, error) {
	var ok bool
	err := s.op(ctx, func(ctx context.Context) error {
		tag, err := s.db.pool.Exec(ctx, s.db.sql.release, key, token)
		ok = err == nil && tag.RowsAffected() == 1
		return err
	})
	return ok, err
}

// Get implements dedup.Store.
func (s *Store) Get(ctx context.Context, key string) (dedup.Entry, error) {
	var e dedup.Entry
	err := s.op(ctx, func(ctx context.Context) error {
		var r row
		err := s.db.pool.QueryRow(ctx, s.db.sql.get, key).Scan(r.dest()...)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err == nil {
			e = r.entry()
		}
		return err
	})
	return e, err
}

// Forget implements dedup.Store.
func (s *Store) Forget(ctx context.Context, key string, force bool) (dedup.Entry, bool, error) {
	var e dedup.Entry
	var deleted bool
	err := s.op(ctx, func(ctx context.Context) error {
		// The notification leaves when the delete commits: every
		// instance's local_cache drops the record.
		return pgx.BeginFunc(ctx, s.db.pool, func(tx pgx.Tx) error {
			var r row
			err := tx.QueryRow(ctx, s.db.sql.forget, key, force).Scan(append([]any{&deleted}, r.dest()...)...)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			if err != nil {
				return err
			}
			e = r.entry()
			if deleted {
				_, err = tx.Exec(ctx, `SELECT pg_notify($1, $2)`, s.db.sql.channel, cacheKey(key))
			}
			return err
		})
	})
	if (deleted || err != nil) && s.db.cache != nil {
		// here at once, without waiting for our own notification; after
		// a failure too, since the delete may have committed with its
		// answer lost
		s.db.cache.Invalidate(cacheKey(key))
	}
	if err != nil {
		return dedup.Entry{}, false, err
	}
	return e, deleted, err
}
