// Command sangho-figures turns the FIGURES lines that the reliability
// suite prints into a table of distributions: for each fault, over every
// run found, the events processed twice (min, median, max), how many runs
// had any, and the most events lost in one run. `make distributions`
// runs the by-nature faults 10 times and pipes them through it:
//
//	go test -count=10 -v -run 'TestSentinelFailover' ./reliability | go run ./cmd/sangho-figures
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

var (
	line  = regexp.MustCompile(`^FIGURES (.+?): events (\d+),`)
	twice = regexp.MustCompile(`processed twice or more (\d+)`)
	lost  = regexp.MustCompile(`lost (\d+)`)
)

type runs struct {
	events        int
	twice, lost   []int
	withAnyDouble int
}

func main() {
	if code, msg := usage(os.Args[1:]); code >= 0 {
		fmt.Fprint(os.Stderr, msg)
		os.Exit(code)
	}
	out, err := table(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sangho-figures:", err)
		os.Exit(1)
	}
	fmt.Print(out)
}

// usage answers the command's arguments: it takes none, it reads stdin.
// code is the exit code (0 for -h and --help, 2 for anything else), -1
// without arguments: go on.
func usage(args []string) (code int, msg string) {
	if len(args) == 0 {
		return -1, ""
	}
	msg = "usage: go test -count=10 -v -run 'TestSentinelFailover' ./reliability | go run ./cmd/sangho-figures\n" +
		"sangho-figures reads the FIGURES lines of the reliability suite on stdin and prints a table; it takes no arguments\n"
	if len(args) == 1 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
		return 0, msg
	}
	return 2, msg
}

// table reads FIGURES lines and renders the Markdown table.
func table(in io.Reader) (string, error) {
	by := map[string]*runs{}
	var order []string
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		m := line.FindStringSubmatch(sc.Text())
		t, l := twice.FindStringSubmatch(sc.Text()), lost.FindStringSubmatch(sc.Text())
		if m == nil || t == nil || l == nil {
			continue
		}
		r := by[m[1]]
		if r == nil {
			r = &runs{}
			by[m[1]] = r
			order = append(order, m[1])
		}
		r.events, _ = strconv.Atoi(m[2])
		n, _ := strconv.Atoi(t[1])
		k, _ := strconv.Atoi(l[1])
		r.twice, r.lost = append(r.twice, n), append(r.lost, k)
		if n > 0 {
			r.withAnyDouble++
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	if len(order) == 0 {
		return "", errors.New("no FIGURES lines on standard input (run go test with -v)")
	}
	var b strings.Builder
	b.WriteString("| fault | events per run | runs | processed twice: min / median / max | runs with any double | most lost in a run |\n|---|---|---|---|---|---|\n")
	for _, name := range order {
		r := by[name]
		s := slices.Clone(r.twice)
		slices.Sort(s)
		fmt.Fprintf(&b, "| %s | %d | %d | %d / %s / %d | %d of %d | %d |\n", name, r.events, len(s), s[0], median(s), s[len(s)-1], r.withAnyDouble, len(s), slices.Max(r.lost))
	}
	return b.String(), nil
}

func median(s []int) string {
	if len(s)%2 == 1 {
		return strconv.Itoa(s[len(s)/2])
	}
	m := float64(s[len(s)/2-1]+s[len(s)/2]) / 2
	return strconv.FormatFloat(m, 'f', -1, 64)
}
