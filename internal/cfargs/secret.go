package cfargs

import (
	"fmt"
	"os"
	"slices"
	"strings"

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

// emptyEnvVars returns the {$VAR}s of line (1-based) of file that are
// unset or empty (their default too), if that line is option's.
func emptyEnvVars(file string, line int, option string) []string {
	if file == "" || line < 1 {
		return nil
	}
	if fi, err := os.Stat(file); err != nil || !fi.Mode().IsRegular() || fi.Size() > 16<<20 {
		return nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil
	}
	lines := strings.Split(string(b), "\n")
	if line > len(lines) {
		return nil
	}
	text := uncommented(lines[line-1])
	if f := strings.Fields(text); len(f) == 0 || f[0] != option {
		return nil // not the line the token came from (the file changed since)
	}
	var vars []string
	for {
		_, rest, ok := strings.Cut(text, "{$")
		if !ok {
			return vars
		}
		span, after, ok := strings.Cut(rest, "}")
		if !ok {
			return vars
		}
		text = after
		name, def, hasDef := strings.Cut(span, ":") // Caddy's {$VAR:default}
		v, set := os.LookupEnv(name)
		if !set && hasDef {
			v = def
		}
		if name != "" && v == "" && !slices.Contains(vars, name) {
			vars = append(vars, name)
		}
	}
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
