package cfargs

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// Secret reads the one argument of an option that holds a secret (a
// password, a DSN), as One does, except that a missing or empty value
// is explained by WithoutValue: by the name of the {$VAR} that left it
// so, when the line can be read again.
func Secret(d *caddyfile.Dispenser, dst *string) error {
	name, file, line := d.Val(), d.File(), d.Line()
	args := d.RemainingArgs()
	switch {
	case len(args) > 1:
		return d.Errf("%s: takes one value, got more", name)
	case len(args) == 0 || args[0] == "":
		return d.Err(WithoutValue(name, file, line))
	}
	*dst = args[0]
	return nil
}

// Resolve resolves v's placeholders. One unset, empty or unknown is an
// error naming the option: an unset {env.REDIS_URL} must not quietly
// become the default 127.0.0.1:6379 (another server, another dedup
// state), nor an unset password no password. The error names the
// placeholder only when the whole value is one {env.*} or {file.*}:
// anything else in a password, a url or a DSN may be the secret, a
// literal brace pair ("{hunter2}") too.
func Resolve(repl *caddy.Replacer, option, v string) (string, error) {
	out, err := repl.ReplaceOrErr(v, true, true)
	if err == nil {
		return out, nil
	}
	if wholeEnvOrFile.MatchString(v) {
		return "", fmt.Errorf("%s: %s is unset or empty", option, v)
	}
	return "", fmt.Errorf("%s: a placeholder in it is unset, empty or unknown (a literal brace is written \\{); the value is not shown, as it may hold a secret", option)
}

// wholeEnvOrFile matches a value that is one {env.*} or {file.*}.
var wholeEnvOrFile = regexp.MustCompile(`^\{(env|file)\.[^{}\\]+\}$`)

// WithoutValue explains an option that holds a secret (the handler's
// secret, a store's password or DSN) left with no value, or an empty
// one. The usual cause is {$VAR}: Caddy replaces it in the whole
// Caddyfile before any directive sees a token, an unset variable with
// nothing, so the variable's name is gone from the tokens. When the
// Caddyfile came from a file (caddy run/adapt --config), the option's
// line is read again to name the variables that are unset or empty
// here; the names only, never a value.
func WithoutValue(option, file string, line int) string {
	vars := emptyEnvVars(file, line, option)
	if len(vars) == 0 {
		return option + " has no value: if it was written {$VAR}, that environment variable was unset or empty when the Caddyfile was read; " +
			"{env.VAR} is read when Caddy starts instead, and keeps the secret out of the adapted JSON"
	}
	named := "{$" + strings.Join(vars, "}, {$") + "}"
	verb := "is"
	if len(vars) > 1 {
		verb = "are"
	}
	return fmt.Sprintf("%s has no value: %s %s unset or empty in the environment of the caddy command that read the Caddyfile (caddy run, reload or adapt replaces {$VAR} as it reads it); "+
		"set it, or write {env.%s}, read when Caddy starts, which keeps the secret out of the adapted JSON", option, named, verb, vars[0])
}

// EmptyVars reads option's line (line, 1-based, of file) again and
// returns its {$VAR}s that are unset, empty or white space. Caddy
// replaces {$VAR} in the text before any directive sees a token, so the
// line means something else without a word: dropped are those that were
// a whole token, which Caddy drops (a secret missing from a rotation
// list, the default store in place of the file named); inside are those
// with more text in their token (whsec_{$X}, {$HOST}:6379), which leave
// the text around them, another value. Both are nil when there are none,
// or the line cannot be read again (a Caddyfile adapted from memory).
// DroppedError and InsideError explain them.
func EmptyVars(option, file string, line int) (dropped, inside []string) {
	text, ok := optionLine(file, line, option)
	if !ok {
		return nil, nil
	}
	add := func(vars []string, span string) []string {
		if name, _, _ := strings.Cut(span, ":"); !slices.Contains(vars, name) {
			return append(vars, name)
		}
		return vars
	}
	for _, field := range fields(text)[1:] {
		spans, rest := envSpans(field)
		value := rest
		for _, span := range spans {
			value += envValue(span)
		}
		for _, span := range spans {
			switch {
			case blank(value) && rest == "":
				dropped = add(dropped, span) // the whole token vanished
			case blank(value): // quoted white space around it: a token of its own
			case blank(envValue(span)):
				inside = add(inside, span)
			}
		}
	}
	return dropped, inside
}

// DroppedError explains the vars Dropped found on option's line; hint
// says what to write instead.
func DroppedError(option string, vars []string, hint string) string {
	verb := "is"
	if len(vars) > 1 {
		verb = "are"
	}
	return fmt.Sprintf("%s: {$%s} %s unset or empty in the environment of the caddy command that read the Caddyfile (caddy run, reload or adapt replaces {$VAR} as it reads it), "+
		"so its value is missing from the line, which would mean something else; %s", option, strings.Join(vars, "}, {$"), verb, hint)
}

// InsideError explains the inside vars EmptyVars found on option's
// line: the value would be the text around them, becomes (a shorter
// secret, another server); hint says what to write instead. The value
// is not quoted: it may hold a password.
func InsideError(option string, vars []string, becomes, hint string) string {
	return fmt.Sprintf("%s: {$%s} inside the value is unset or empty in the environment of the caddy command that read the Caddyfile: the value would be the text around it, %s; %s",
		option, strings.Join(vars, "}, {$"), becomes, hint)
}

// WholeValueHint is the hint of an option whose value may hold a secret:
// give it whole in {env.X}, which Caddy reads when it starts.
func WholeValueHint(name string) string {
	return "set it, or give the whole value in one variable, {env." + name + "}, read when Caddy starts and refused if empty"
}

// blank reports whether v is empty or white space only, which Caddy's
// lexer reads as no token.
func blank(v string) bool { return strings.TrimSpace(v) == "" }

// fields splits a Caddyfile line into its tokens as written: at spaces
// and tabs outside double quotes or backticks, the quotes dropped, an
// escaped quote inside quotes kept as a quote (as Caddy's lexer does).
func fields(line string) []string {
	var out []string
	var b strings.Builder
	var quote rune
	in := false
	escaped := false
	for _, c := range line {
		switch {
		case escaped: // after a backslash in quotes: \" is a quote, else both are kept
			if c != quote {
				b.WriteRune('\\')
			}
			b.WriteRune(c)
			escaped = false
		case quote != 0 && c == '\\':
			escaped = true
		case quote != 0 && c == quote:
			quote = 0
		case quote != 0:
			b.WriteRune(c)
		case c == '"' || c == '`':
			quote, in = c, true
		case c == ' ' || c == '\t' || c == '\r':
			if in {
				out = append(out, b.String())
				b.Reset()
				in = false
			}
		default:
			b.WriteRune(c)
			in = true
		}
	}
	if in {
		out = append(out, b.String())
	}
	return out
}

// envSpans returns the {$VAR} spans of text (as NAME or NAME:default)
// and what is left of text without them.
func envSpans(text string) (spans []string, rest string) {
	for {
		before, after, ok := strings.Cut(text, "{$")
		if !ok {
			return spans, rest + text
		}
		span, tail, ok := strings.Cut(after, "}")
		if !ok {
			return spans, rest + text
		}
		spans = append(spans, span)
		rest += before
		text = tail
	}
}

// envValue is the value Caddy gives {$span}: the variable's, else the
// default after ':' when the variable is unset.
func envValue(span string) string {
	name, def, hasDef := strings.Cut(span, ":")
	v, set := os.LookupEnv(name)
	if !set && hasDef {
		v = def
	}
	if name == "" {
		return "-" // not a variable
	}
	return v
}

// optionLine is line (1-based) of file without its comment, if it is
// option's line.
func optionLine(file string, line int, option string) (string, bool) {
	if file == "" || line < 1 {
		return "", false
	}
	if fi, err := os.Stat(file); err != nil || !fi.Mode().IsRegular() || fi.Size() > 16<<20 {
		return "", false
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", false
	}
	lines := strings.Split(string(b), "\n")
	if line > len(lines) {
		return "", false
	}
	text := uncommented(lines[line-1])
	if f := strings.Fields(text); len(f) == 0 || f[0] != option {
		return "", false // not the line the token came from (the file changed since)
	}
	// A line that ends in a backslash goes on on the next (Caddy's lexer
	// chains arguments so).
	for n := line; strings.HasSuffix(strings.TrimRight(text, " \t\r"), "\\") && n < len(lines); n++ {
		text = strings.TrimSuffix(strings.TrimRight(text, " \t\r"), "\\") + " " + uncommented(lines[n])
	}
	return text, true
}

// emptyEnvVars returns the {$VAR}s of line (1-based) of file that are
// unset or empty (their default too), if that line is option's.
func emptyEnvVars(file string, line int, option string) []string {
	text, ok := optionLine(file, line, option)
	if !ok {
		return nil
	}
	var vars []string
	spans, _ := envSpans(text)
	for _, span := range spans {
		name, _, _ := strings.Cut(span, ":")
		if envValue(span) == "" && !slices.Contains(vars, name) { // "" is no variable: envValue says "-"
			vars = append(vars, name)
		}
	}
	return vars
}

// uncommented returns line without its comment: from a # that begins a
// token (at the start, or after a space or a tab), outside quotes.
func uncommented(line string) string {
	var quote rune
	for i, c := range line {
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '"' || c == '`':
			quote = c
		case c == '#' && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t'):
			return line[:i]
		}
	}
	return line
}
