package load

import (
	"strconv"
	"strings"
)

// NestedBody is an event whose data is a push of n commits, each a
// small object of strings, numbers, booleans and arrays, like a GitHub
// push webhook: many small nested values, the ID scanner's worst case
// (Body's one long string is its best). A commit is about 377 bytes:
// 185 of them, the push of the root package's benchmarks, make 69,854
// bytes with a 10-byte ID.
func NestedBody(id string, n int) string {
	return nestedBody(id, n, 0)
}

// NestedBodySize is NestedBody with as many commits as fit in size
// bytes, the last commit's message made longer to fill the rest: the
// body is exactly size bytes, or one commit's if size is smaller.
func NestedBodySize(id string, size int) string {
	total := len(nestedHead(id)) + len(nestedTail)
	n := 0
	for {
		next := len(nestedCommit(n, 0))
		if n > 0 {
			next++ // the comma
		}
		if n > 0 && total+next > size {
			break
		}
		total += next
		n++
	}
	return nestedBody(id, n, max(0, size-total))
}

const nestedTail = `]}}}`

func nestedHead(id string) string {
	return `{"id":"` + id + `","type":"push","data":{"object":{"ref":"refs/heads/main","forced":false,"commits":[`
}

// nestedCommit is the push's commit i, its message pad bytes longer.
func nestedCommit(i, pad int) string {
	c := strconv.Itoa(i)
	return `{"id":"4b1c` + c + `e0f","tree_id":"9a8f` + c + `","distinct":true,"message":"Fix \"parser\" edge ` + c + strings.Repeat("x", pad) +
		`","timestamp":"2026-12-05T07:55:37Z","author":{"name":"A. Dev","email":"a@example.com","username":"adev"},` +
		`"committer":{"name":"A. Dev","email":"a@example.com","date":null},"added":["src/a` + c + `.go"],` +
		`"removed":[],"modified":["README.md","go.mod","internal/x/y.go"],"stats":{"n":` + c + `,"ok":1.5e3}}`
}

// nestedBody is NestedBody with pad more bytes in the last commit's
// message.
func nestedBody(id string, n, pad int) string {
	var sb strings.Builder
	sb.WriteString(nestedHead(id))
	for i := range n {
		if i > 0 {
			sb.WriteByte(',')
		}
		p := 0
		if i == n-1 {
			p = pad
		}
		sb.WriteString(nestedCommit(i, p))
	}
	sb.WriteString(nestedTail)
	return sb.String()
}
