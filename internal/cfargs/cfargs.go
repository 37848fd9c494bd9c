// Package cfargs holds the Caddyfile helpers shared by the parsers of
// the handler, the stores and the providers; their errors name the
// option.
package cfargs

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// Options registers the options of a module's Caddyfile block: the
// JSON names of the fields of its struct (the Caddyfile's options are
// its fields' names), and extra, those of the Caddyfile only. Unknown
// and NoBlock quote only a token close to one of the options of any
// block (a typo, an option in the wrong block), never another: a secret
// can look like an option's name.
func Options(module any, extra ...string) {
	known.Lock()
	defer known.Unlock()
	for _, name := range append(fieldNames(module), extra...) {
		if !slices.Contains(known.names, name) {
			known.names = append(known.names, name)
		}
	}
}

var known struct {
	sync.Mutex
	names []string
}

// nearOption returns the option closest to tok among own (the block's
// options, first) and all registered ones, if tok is one of them or a
// typo of it; "" if none is. A typo is an option written in camel or
// kebab case (maxBodySize, tls-insecure-skip-verify), or in lower case
// and _ only, like every option, within one edit of it (two from ten
// characters; a swap of neighbours is one). A token with a digit or a
// capital is quoted only in the first case, and a short lower-case one
// only one edit away, since weak secrets look like that (Secret,
// password1, mysecret).
func nearOption(tok string, own []string) string {
	known.Lock()
	all := append(append([]string(nil), own...), known.names...)
	known.Unlock()
	if snake := snakeCase(tok); snake != "" && slices.Contains(all, snake) {
		return snake
	}
	if !optionShape(tok) {
		return ""
	}
	limit := 1
	if len(tok) >= 10 {
		limit = 2
	}
	best, bestDist := "", limit+1
	for _, name := range all {
		if d := editDistance(tok, name, limit); d < bestDist {
			best, bestDist = name, d
		}
	}
	return best
}

// optionShape reports whether tok is written as every option is: lower
// case letters and _, starting with a letter.
func optionShape(tok string) bool {
	if tok == "" || tok[0] < 'a' || tok[0] > 'z' {
		return false
	}
	for i := range len(tok) {
		if c := tok[i]; (c < 'a' || c > 'z') && c != '_' {
			return false
		}
	}
	return true
}

// snakeCase writes a camel- or kebab-case tok as options are written:
// maxBodySize and max-body-size are max_body_size, lockTTL lock_ttl; ""
// for a tok in neither case (Secret, a capital first only, is none).
func snakeCase(tok string) string {
	camel := false
	for i := 1; i < len(tok); i++ {
		if tok[i] >= 'A' && tok[i] <= 'Z' && tok[i-1] >= 'a' && tok[i-1] <= 'z' {
			camel = true
		}
	}
	if !camel && !strings.Contains(tok, "-") {
		return ""
	}
	var b strings.Builder
	for i := range len(tok) {
		c := tok[i]
		switch {
		case c == '-':
			c = '_'
		case c >= 'A' && c <= 'Z':
			if i > 0 && tok[i-1] >= 'a' && tok[i-1] <= 'z' {
				b.WriteByte('_')
			}
			c += 'a' - 'A'
		}
		b.WriteByte(c)
	}
	return b.String()
}

// editDistance is the number of single-character insertions, deletions,
// substitutions and swaps of neighbours that turn a into b (the optimal
// string alignment distance: "dns" is one edit from "dsn"), or limit+1
// once it is known to be over limit.
func editDistance(a, b string, limit int) int {
	if d := len(a) - len(b); d > limit || -d > limit {
		return limit + 1
	}
	// rows[i][j]: the distance between a[:i] and b[:j].
	rows := make([][]int, len(a)+1)
	for i := range rows {
		rows[i] = make([]int, len(b)+1)
		rows[i][0] = i
	}
	for j := range rows[0] {
		rows[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d := min(rows[i-1][j]+1, rows[i][j-1]+1, rows[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d = min(d, rows[i-2][j-2]+1)
			}
			rows[i][j] = d
		}
	}
	if d := rows[len(a)][len(b)]; d <= limit {
		return d
	}
	return limit + 1
}

// fieldNames is the JSON names of module's fields (see Options).
func fieldNames(module any) []string {
	if module == nil {
		return nil
	}
	t := reflect.TypeOf(module)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var names []string
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); name != "" && name != "-" {
			names = append(names, name)
		}
	}
	return names
}

// secretOptions hold secrets: a token near one of them is not even
// named by a suggestion ("did you mean password?" would tell how close
// a secret put there is to that word).
var secretOptions = []string{"secret", "password", "username", "dsn", "url"}

// Unknown refuses the option in d.Val(), which what (e.g. "redis store
// option") does not know; module is the block's (see Options). It
// quotes the token only if it is an option's name (of another block);
// for the name in camel or kebab case, or a typo of one (see
// nearOption), it names the option meant, not the token. Anything else
// may be a secret: Caddy replaces {$VAR} in the text before it splits
// it into lines, so the second line of a value with a line break (a
// secret, a DSN) comes where an option's name goes, and a weak secret
// looks like an option's name; the error gives the line.
func Unknown(d *caddyfile.Dispenser, what string, module any) error {
	opt := d.Val()
	own := fieldNames(module)
	switch near := nearOption(opt, own); {
	case near == opt:
		return d.Errf("unrecognized %s %q", what, opt)
	case near != "" && !slices.Contains(secretOptions, near):
		return d.Errf("unrecognized %s (not shown, as it may be a secret; did you mean %s?)", what, near)
	default:
		return d.Errf("unrecognized %s (not shown: it is no option's name, and may be a secret, e.g. the next line of a {$VAR}'s value)", what)
	}
}

// NoBlock refuses a block after a module's line, for a module that takes
// no options. The first token is quoted only if it is an option's name
// (see Unknown): a secret put in the wrong block is not.
func NoBlock(d *caddyfile.Dispenser) error {
	if nesting := d.Nesting(); d.NextBlock(nesting) {
		if opt := d.Val(); nearOption(opt, nil) == opt {
			return d.Errf("takes no options, found %q", opt)
		}
		return d.Err("takes no options (found a token not shown: it is no option's name, and may be a secret)")
	}
	return nil
}

// Once refuses a subdirective given a second time, except the
// repeatable one (whose values accumulate).
func Once(d *caddyfile.Dispenser, seen map[string]bool, who, repeatable string) error {
	opt := d.Val()
	if opt == repeatable {
		return nil
	}
	if seen[opt] {
		return d.Errf("%s: %s given more than once", who, opt)
	}
	seen[opt] = true
	return nil
}

// notRepeated ends an error about a value that is not quoted.
const notRepeated = "; the value is not repeated here, as it may be a secret"

// NoValue refuses a value after the current token (a directive's, a
// store's or a provider's name), whose options go in its block; who,
// if not empty, prefixes the error. It never quotes the value, as
// Caddy's ArgErr would: what is written there by mistake is often the
// secret, a DSN or a URL with its password.
func NoValue(d *caddyfile.Dispenser, who, hint string) error {
	if !d.NextArg() {
		return nil
	}
	msg := "takes no value on its line (" + hint + ")" + notRepeated
	if who != "" {
		msg = who + ": " + msg
	}
	return d.Err(msg)
}

// NoMore refuses a value after the arguments already read, as NoValue,
// with what says what the line takes.
func NoMore(d *caddyfile.Dispenser, what string) error {
	if !d.NextArg() {
		return nil
	}
	return d.Err("takes at most " + what + " on its line" + notRepeated)
}

// Known refuses a module name (d.Val()) that is not one of namespace's
// modules, listing them. It does not quote the name: what is written
// there by mistake may be a secret ("provider whsec_…", "store
// redis://:pw@host").
func Known(d *caddyfile.Dispenser, option, namespace string) error {
	var names []string
	for _, m := range caddy.GetModules(namespace) {
		if m.ID.Name() == d.Val() {
			return nil
		}
		names = append(names, m.ID.Name())
	}
	return d.Errf("%s: not one of %s%s", option, strings.Join(names, ", "), notRepeated)
}

// Flag sets the flag option in d.Val(), which takes no argument.
func Flag(d *caddyfile.Dispenser, dst *bool) error {
	name := d.Val()
	if d.NextArg() {
		return d.Err(name + ": takes no argument" + notRepeated)
	}
	*dst = true
	return nil
}

// One reads the one argument of the option in d.Val().
func One(d *caddyfile.Dispenser, dst *string) error {
	name := d.Val()
	if d.CountRemainingArgs() == 0 {
		return d.Errf("%s: needs a value", name)
	}
	if !d.AllArgs(dst) {
		return d.Errf("%s: takes one value, got more", name)
	}
	if *dst == "" { // written "": no option means its default
		return d.Errf(`%s: needs a value, not ""`, name)
	}
	return nil
}

// Int reads the one argument of the option in d.Val() as a
// non-negative whole number.
func Int(d *caddyfile.Dispenser, dst *int) error {
	name, s := d.Val(), ""
	if err := One(d, &s); err != nil {
		return err
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return d.Errf("%s: %q is not a non-negative whole number", name, s)
	}
	*dst = n
	return nil
}

// Duration reads the one argument of the option in d.Val() as a
// positive duration (caddy.ParseDuration: 30s, 1h, 2d) within [min,
// max] (0: no bound), so that a value out of range is refused where it
// is written, quoted as written.
func Duration(d *caddyfile.Dispenser, dst *caddy.Duration, min, max time.Duration) error {
	name, s := d.Val(), ""
	if err := One(d, &s); err != nil {
		return err
	}
	dur, err := caddy.ParseDuration(s)
	if err != nil {
		return d.Errf("%s: invalid duration %q: %s", name, s, durationError(s, err))
	}
	if dur <= 0 {
		return d.Errf("%s: duration must be positive, got %q", name, s)
	}
	if err := Range(name, strconv.Quote(s), dur, min, max); err != nil {
		return d.Err(err.Error())
	}
	*dst = caddy.Duration(dur)
	return nil
}

// Range refuses v outside [min, max] (0: no bound), naming the option
// and the value as shown (quoted as written in a Caddyfile, Human(v)
// from JSON): "tolerance: \"8d\" is over the maximum of 7d".
func Range(name, shown string, v, min, max time.Duration) error {
	switch {
	case min > 0 && v < min:
		return fmt.Errorf("%s: %s is under the minimum of %s", name, shown, Human(min))
	case max > 0 && v > max:
		return fmt.Errorf("%s: %s is over the maximum of %s", name, shown, Human(max))
	}
	return nil
}

// Bounds is Range for a value from JSON or a default, shown as Human(v).
func Bounds(name string, v, min, max time.Duration) error {
	return Range(name, Human(v), v, min, max)
}

// Human writes d as a user writes it: whole days from 2 days up (7d),
// else Go's form without its trailing zero minutes and seconds (24h,
// 1h30m, 30ms; 168h0m1s as Go writes it).
func Human(d time.Duration) string {
	const day = 24 * time.Hour
	if d >= 2*day && d%day == 0 {
		return strconv.FormatInt(int64(d/day), 10) + "d"
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// durationError says why caddy.ParseDuration refused s. Caddy rewrites
// each "<n>d" as hours before Go's parser reports, whose error then
// quotes a value never written ("3days" as "72hays"): for a value with
// a d, the form and range accepted instead. Else Go's error, which
// quotes s as written (or Caddy's, for a value over its 1024 bytes,
// refused before any rewrite).
func durationError(s string, err error) string {
	if len(s) > 1024 || !strings.ContainsRune(s, 'd') {
		return err.Error()
	}
	return "write a number and a unit per part (ns, us, µs, ms, s, m, h, d), as 90s, 72h, 3d or 1d12h, under 106752d"
}

// DecodeJSON decodes a module's JSON config b into v, a pointer to a
// struct without an UnmarshalJSON of its own, as Caddy does (an unknown
// key refused), and answers a bad duration (a caddy.Duration field)
// with its key and the value as written, as the Caddyfile's Duration
// does: Caddy's own error names no key and may quote its rewrite of the
// value ("3days" as "72hays").
func DecodeJSON(b []byte, v any) error {
	err := caddy.StrictUnmarshalJSON(b, v)
	if err == nil {
		return nil
	}
	var raw map[string]json.RawMessage
	if json.Unmarshal(b, &raw) != nil {
		return err
	}
	t := reflect.TypeOf(v).Elem()
	for i := range t.NumField() {
		f := t.Field(i)
		key, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		r, ok := raw[key]
		if f.Type != reflect.TypeFor[caddy.Duration]() || !ok {
			continue
		}
		var d caddy.Duration
		derr := d.UnmarshalJSON(r)
		if derr == nil {
			continue
		}
		var s string
		if json.Unmarshal(r, &s) == nil {
			return fmt.Errorf("%s: invalid duration %q: %s", key, s, durationError(s, derr))
		}
		return fmt.Errorf("%s: invalid duration %s: a number of nanoseconds or a string such as \"90s\" or \"3d\"", key, r)
	}
	// A value of the wrong JSON type: by its key, not by the decoder's
	// Go type (the caller's method-less copy of its struct).
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return fmt.Errorf("%s: a JSON %s, not the %s it takes", te.Field, te.Value, te.Type)
	}
	return err
}
