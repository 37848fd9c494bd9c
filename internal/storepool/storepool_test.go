package storepool

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

type resource struct{ closed atomic.Bool }

func (r *resource) Destruct() error { r.closed.Store(true); return nil }

func take(t *testing.T, key string, r *resource) {
	t.Helper()
	if _, _, err := Pool.LoadOrNew(key, func() (caddy.Destructor, error) { return r, nil }); err != nil {
		t.Fatal(err)
	}
}

// A use that enters after Release closed the resource is told so (a
// store then refuses the claim: its commit could not land); one that
// enters before keeps the resource open until it leaves; one that
// enters after a Release that left the resource to another config is
// told so too: it is counted in no config that still holds the resource,
// whose own Release would close it under the use (found by review: the
// event's commit failed, and its retry was processed again).
func TestUsersClosed(t *testing.T) {
	t.Run("closed at once", func(t *testing.T) {
		key, r, u := t.Name(), new(resource), new(Users)
		take(t, key, r)
		if err := u.Release(key, nil); err != nil {
			t.Fatal(err)
		}
		if !r.closed.Load() {
			t.Fatal("a resource no use entered was not closed at once")
		}
		u.Enter()
		defer u.Leave()
		if !u.Closed() {
			t.Error("Closed: false for a use that entered after the resource was closed")
		}
	})
	t.Run("kept for a use", func(t *testing.T) {
		key, r, u := t.Name(), new(resource), new(Users)
		take(t, key, r)
		u.Enter()
		if err := u.Release(key, nil); err != nil {
			t.Fatal(err)
		}
		if r.closed.Load() || u.Closed() {
			t.Fatal("the resource was closed under a use that entered before Release")
		}
		u.Leave()
		deadline := time.Now().Add(10 * time.Second)
		for !r.closed.Load() {
			if time.Now().After(deadline) {
				t.Fatal("the resource is still open 10 s after its last use left")
			}
			time.Sleep(10 * time.Millisecond)
		}
		u.Enter() // a late request, after the delayed close
		defer u.Leave()
		if !u.Closed() {
			t.Error("Closed: false for a use that entered after the delayed close")
		}
	})
	t.Run("shared with another config", func(t *testing.T) {
		key, r, u := t.Name(), new(resource), new(Users)
		take(t, key, r)
		take(t, key, r) // the new config's
		defer Pool.Delete(key)
		for range 2 { // a second Release changes nothing
			if err := u.Release(key, nil); err != nil {
				t.Fatal(err)
			}
		}
		u.Enter()
		defer u.Leave()
		if r.closed.Load() {
			t.Error("closed while another config still holds the resource")
		}
		if !u.Closed() {
			t.Error("Closed: false for a use that entered after its config released the resource: nothing keeps it open for the use")
		}
		if n, _ := Pool.References(key); n != 1 {
			t.Errorf("the other config's reference: %d references left, want 1", n)
		}
	})
}

// lockedFile is a resource one process may open once, as the file
// store's database (it locks the file): opening it while the last one
// is still closing fails.
type lockedFile struct {
	open    *atomic.Int64
	closing chan struct{} // Destruct has begun
	release chan struct{} // lets Destruct finish
}

func (f *lockedFile) Destruct() error {
	close(f.closing)
	if f.release != nil {
		<-f.release
	}
	f.open.Add(-1)
	return nil
}

// A reload back to a file's settings while the last config that used
// it is closing it waits for the close, then opens the file again: it
// failed with "in use by another process".
func TestPoolReopensOnlyOnceClosed(t *testing.T) {
	key := t.Name()
	var open atomic.Int64
	release := make(chan struct{}) // the first file's close
	newFile := func() (caddy.Destructor, error) {
		if open.Add(1) > 1 {
			open.Add(-1)
			return nil, errors.New("in use by another process")
		}
		f := &lockedFile{open: &open, closing: make(chan struct{}), release: release}
		release = nil
		return f, nil
	}
	v, _, err := Pool.LoadOrNew(key, newFile)
	if err != nil {
		t.Fatal(err)
	}
	first := v.(*lockedFile)
	go Pool.Delete(key) // the old config's last use ends
	<-first.closing
	reopened := make(chan error, 1)
	go func() { // the reload
		_, _, err := Pool.LoadOrNew(key, newFile)
		reopened <- err
	}()
	select {
	case err := <-reopened:
		t.Fatalf("opened again while the last one was closing: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(first.release)
	if err := <-reopened; err != nil {
		t.Fatalf("opened again once closed: %v", err)
	}
	if _, err := Pool.Delete(key); err != nil {
		t.Fatal(err)
	}
}

// runCaddy runs an empty config, as after a reload: the config that
// used a resource is no longer the running one. The test's cleanup
// stops Caddy.
func runCaddy(t *testing.T) {
	t.Helper()
	if err := caddy.Load([]byte(`{"admin":{"disabled":true,"config":{"persist":false}},"logging":{"logs":{"default":{"writer":{"output":"discard"}}}}}`), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
}

// On a reload a resource no use holds is kept for the reload's linger,
// for a request the old config's server read before its shutdown and
// that reaches the store after the cleanup; a use entering then is
// served, and keeps it until it leaves. Caddy stopping ends the linger:
// a Release when Caddy stops returns once the lingering resources are
// closed.
func TestUsersReleaseLingersOnReload(t *testing.T) {
	const linger = 2 * time.Second
	defer SetReloadLinger(linger)()
	waitClosed := func(t *testing.T, r *resource, within time.Duration) {
		t.Helper()
		deadline := time.Now().Add(within)
		for !r.closed.Load() {
			if time.Now().After(deadline) {
				t.Fatalf("the resource is still open after %v", within)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// released runs a config, as after a reload, and releases a resource
	// no use holds.
	released := func(t *testing.T) (key string, r *resource, u *Users) {
		t.Helper()
		runCaddy(t)
		key, r, u = t.Name(), new(resource), new(Users)
		take(t, key, r)
		if err := u.Release(key, nil); err != nil {
			t.Fatal(err)
		}
		return key, r, u
	}
	t.Run("kept, then closed", func(t *testing.T) {
		_, r, u := released(t)
		time.Sleep(linger / 2)
		u.Enter() // a request that reaches the store after the cleanup
		if r.closed.Load() || u.Closed() {
			t.Fatal("the resource was closed within the linger of the reload")
		}
		time.Sleep(linger/2 + linger/4)
		if r.closed.Load() {
			t.Fatal("the resource was closed under a use that entered within the linger")
		}
		u.Leave()
		waitClosed(t, r, 5*time.Second)
		u.Enter()
		defer u.Leave()
		if !u.Closed() {
			t.Error("Closed: false for a use that entered after the close")
		}
	})
	t.Run("Caddy stops", func(t *testing.T) {
		key, r, _ := released(t)
		if err := caddy.Stop(); err != nil {
			t.Fatal(err)
		}
		// The stopping config's own store releases its resource.
		last, lastR := new(Users), new(resource)
		take(t, key+"/last", lastR)
		if err := last.Release(key+"/last", nil); err != nil {
			t.Fatal(err)
		}
		if !lastR.closed.Load() {
			t.Error("Caddy stopping: the running config's resource was not closed at once")
		}
		if !r.closed.Load() {
			t.Error("Caddy stopping: a Release returned before the resource a reload left lingering was closed")
		}
	})
	// Caddy exiting (its exit hook, or the stopping config's Release
	// once the servers have stopped) ends the linger even while Caddy
	// exits with its config still set: at once, not at the linger's end.
	t.Run("Caddy exits", func(t *testing.T) {
		_, r, _ := released(t)
		start := time.Now()
		endLingers()
		if !r.closed.Load() {
			t.Fatal("endLingers returned before the lingering resource was closed")
		}
		if waited := time.Since(start); waited > linger/2 {
			t.Errorf("endLingers waited %v: the linger ran out instead of ending", waited)
		}
	})
	t.Run("Caddy stops with nothing of ours", func(t *testing.T) {
		_, r, _ := released(t)
		if err := caddy.Stop(); err != nil {
			t.Fatal(err)
		}
		waitClosed(t, r, linger/2) // not the linger
	})
}
