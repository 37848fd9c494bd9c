package main

import (
	"strings"
	"testing"
)

func TestTable(t *testing.T) {
	in := `=== RUN   TestX
FIGURES Sentinel failover: events 200, deliveries 9; processed once 197, processed twice or more 3, lost 0
FIGURES Sentinel failover: events 200, deliveries 9; processed once 200, processed twice or more 0, lost 0
FIGURES Sentinel failover: events 200, deliveries 9; processed once 199, processed twice or more 1, lost 0
FIGURES kill: events 100, deliveries 9; processed once 100, processed twice or more 0, lost 2
FIGURES restart: events 50, deliveries 9; processed once 49, processed twice or more 1, lost 3
FIGURES restart: events 50, deliveries 9; processed once 48, processed twice or more 2, lost 1
--- PASS: TestX
`
	got, err := table(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| Sentinel failover | 200 | 3 | 0 / 1 / 3 | 2 of 3 | 0 |",
		"| kill | 100 | 1 | 0 / 0 / 0 | 0 of 1 | 2 |",
		// an even count's median is the mean of the middle two; the
		// most lost is the largest of any run, not the last
		"| restart | 50 | 2 | 1 / 1.5 / 2 | 2 of 2 | 3 |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	if _, err := table(strings.NewReader("no figures here\n")); err == nil {
		t.Error("no error without FIGURES lines")
	}
}

// TestArguments: sangho-figures reads stdin only; --help prints its usage
// (exit 0), any other argument is refused with it (exit 2), instead of
// being ignored while it waits on a terminal. (Found by review.)
func TestArguments(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
	}{{[]string{"--help"}, 0}, {[]string{"-h"}, 0}, {[]string{"figures.txt"}, 2}} {
		if code, msg := usage(c.args); code != c.code || !strings.Contains(msg, "go test") || !strings.Contains(msg, "| go run ./cmd/sangho-figures") {
			t.Errorf("%v: exit %d, %q; want exit %d and the usage", c.args, code, msg, c.code)
		}
	}
	if code, _ := usage(nil); code != -1 {
		t.Errorf("no argument: exit %d, want to go on (-1)", code)
	}
}
