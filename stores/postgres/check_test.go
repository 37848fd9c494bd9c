package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/pgtest"
)

// TestSynchronousCommitOffWarned: a server (or role, or database) with
// synchronous_commit off acknowledges commits it can lose in a crash of
// PostgreSQL, and the sender's retry of such an event is then processed
// again, unmarked. The store's first check says so, once, with the fix;
// a DSN that sets synchronous_commit=on for the store's sessions is not
// warned about, nor is a server with the default. (Found by review: a
// commit acknowledged with synchronous_commit off was gone after
// pg_ctl stop -m immediate, and the redelivery's claim was Claimed.)
func TestSynchronousCommitOffWarned(t *testing.T) {
	off := pgtest.Start(t, "synchronous_commit=off")
	on := pgtest.Start(t)
	for _, c := range []struct {
		name, dsn string
		warned    bool
	}{
		{"server off", off.DSN, true},
		{"server off, the DSN on", off.DSN + "&synchronous_commit=on", false},
		{"server on", on.DSN, false},
	} {
		s, logs := provision(t, storeJSON(c.dsn, uniqueTable()))
		for i := range 2 {
			if _, _, err := s.Claim(context.Background(), "evt_sync_"+string(rune('a'+i)), "tok", time.Minute); err != nil {
				t.Fatalf("%s: claim: %v", c.name, err)
			}
		}
		got := logs.FilterMessage("postgres synchronous_commit off").All()
		if want := map[bool]int{true: 1, false: 0}[c.warned]; len(got) != want {
			t.Errorf("%s: %d warnings, want %d: %v", c.name, len(got), want, logs.All())
			continue
		}
		if c.warned {
			if f := got[0].ContextMap(); f["fix"] == nil || f["risk"] == nil || f["table"] == nil {
				t.Errorf("%s: the warning's fields: %v", c.name, f)
			}
		}
	}
}
