package sanghodedup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "sangho-dedup",
		Usage: "get|forget <id> [--name <name>] [--force] [--config <path> [--adapter <name>]] [--address <admin>] [--json]",
		Short: "Looks up or forgets a webhook event in a running Caddy's sangho_dedup store",
		Long: `
Talks to the admin API of a running Caddy, found as caddy stop finds
it: at --address, else at the admin address of the config given with
--config (and --adapter), else at Caddy's default admin address,
localhost:2019 (no Caddyfile in the current folder is read).

  caddy sangho-dedup get <id> [--name N]            did the event reach the backend, and when?
  caddy sangho-dedup forget <id> [--name N] [--force]
                                                    let the next delivery of the event through

--name picks the endpoint (a handler's name, by default its key_prefix
without the trailing colon: sangho_dedup);
it may be omitted when the config has one. forget refuses an event in
flight (a delivery holds its lease) unless --force, which removes its lease
too: a redelivery may then be processed while the backend still works.

Exit status: 0 found (get) or forgotten (forget), 1 the store has nothing
for the event, 2 any error. --json prints the admin API's answer.
`,
		CobraFunc: func(cmd *cobra.Command) {
			// A mistake in the command line is "any error", 2: Caddy's main
			// would exit 1 on it, which says the store has nothing for
			// the event.
			usage := func(c *cobra.Command, err error) error {
				fmt.Fprintf(os.Stderr, "sangho-dedup: %v\nUsage: caddy sangho-dedup get|forget <id> [flags] (caddy sangho-dedup --help)\n", err)
				os.Exit(2)
				return err
			}
			cmd.SetFlagErrorFunc(usage)
			cmd.Args = cobra.ArbitraryArgs
			cmd.RunE = func(c *cobra.Command, args []string) error {
				if len(args) == 0 {
					return usage(c, errors.New("a subcommand is needed: get or forget"))
				}
				return usage(c, fmt.Errorf("unknown subcommand %q: get or forget", args[0]))
			}
			for _, sub := range []struct{ name, short string }{
				{"get", "Shows what the store holds for an event"},
				{"forget", "Forgets a processed event so that its next delivery is processed"},
			} {
				c := &cobra.Command{
					Use:   sub.name + " <id>",
					Short: sub.short,
					Args: func(c *cobra.Command, args []string) error {
						if len(args) != 1 {
							return usage(c, fmt.Errorf("%s takes one event ID, not %d arguments", c.Name(), len(args)))
						}
						return nil
					},
					RunE: func(c *cobra.Command, args []string) error {
						code, err := runEventCommand(c, sub.name, args[0], os.Stdout)
						if err != nil {
							fmt.Fprintln(os.Stderr, "sangho-dedup:", err)
						}
						if code != 0 {
							os.Exit(code)
						}
						return nil
					},
				}
				c.Flags().String("name", "", "endpoint name (default: the only one)")
				c.Flags().StringP("config", "c", "", "config file to read the admin address from, if --address is not used")
				c.Flags().StringP("adapter", "a", "", "name of the config adapter to apply (when --config is used)")
				c.Flags().String("address", "", "admin API address (default: the config's, else "+caddy.DefaultAdminListen+")")
				c.Flags().Bool("json", false, "print the admin API's JSON answer")
				if sub.name == "forget" {
					c.Flags().Bool("force", false, "also remove the lease of an event in flight (dangerous)")
				}
				cmd.AddCommand(c)
			}
		},
	})
}

// runEventCommand runs `get` or `forget` and returns the exit status.
func runEventCommand(c *cobra.Command, verb, id string, out io.Writer) (int, error) {
	name, _ := c.Flags().GetString("name")
	addr, _ := c.Flags().GetString("address")
	asJSON, _ := c.Flags().GetBool("json")
	force, _ := c.Flags().GetBool("force")
	config, _ := c.Flags().GetString("config")
	adapter, _ := c.Flags().GetString("adapter")
	var loaded []byte
	if addr == "" && config != "" {
		var err error
		if loaded, _, _, err = caddycmd.LoadConfig(config, adapter); err != nil {
			return 2, fmt.Errorf("finding the admin address in --config %s: %v", config, err)
		}
		var c struct {
			Admin caddy.AdminConfig `json:"admin"`
		}
		if json.Unmarshal(loaded, &c) == nil && c.Admin.Disabled {
			return 2, fmt.Errorf("the config %s has its admin API off (admin off): get and forget go through it; give it an admin address, or --address of a Caddy that has one", config)
		}
	}
	addr, err := caddycmd.DetermineAdminAPIAddress(addr, loaded, config, adapter)
	if err != nil {
		return 2, fmt.Errorf("finding the admin address in --config %s: %v", config, err)
	}
	client, base, origin, err := adminClient(addr)
	if err != nil {
		return 2, err
	}
	call := func(method, uri string) (int, []byte, error) {
		status, body, err := adminDo(client, base, origin, method, uri)
		if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
			err = fmt.Errorf("%w (is Caddy running, with its admin API at %s? --address or --config gives another)", err, addr)
		}
		return status, body, err
	}
	if name == "" {
		var list []EndpointInfo
		if status, body, err := call(http.MethodGet, "/sangho_dedup/"); err != nil {
			return 2, err
		} else if status != http.StatusOK {
			if asJSON && json.Valid(body) {
				_, _ = out.Write(body)
			}
			return 2, fmt.Errorf("listing the endpoints: %s", apiMessage(status, body))
		} else if err := json.Unmarshal(body, &list); err != nil {
			return 2, fmt.Errorf("listing the endpoints: %v", err)
		}
		switch len(list) {
		case 1:
			name = list[0].Name
		case 0:
			return 2, errors.New("the running config has no sangho_dedup endpoint")
		default:
			names := make([]string, len(list))
			for i, e := range list {
				names[i] = e.Name
			}
			return 2, fmt.Errorf("the running config has %d sangho_dedup endpoints: give --name (one of %s)", len(list), strings.Join(names, ", "))
		}
	}
	method, uri := http.MethodGet, "/sangho_dedup/"+url.PathEscape(name)+"/events/"+url.PathEscape(id)
	if verb == "forget" {
		method = http.MethodDelete
		if force {
			uri += "?force=true"
		}
	}
	status, body, err := call(method, uri)
	if err != nil {
		return 2, err
	}
	if asJSON && json.Valid(body) {
		_, _ = out.Write(body) // the API's answer, a refusal too; the exit status says which
	}
	var info EventInfo
	if status == http.StatusOK || status == http.StatusNotFound {
		if json.Unmarshal(body, &info) != nil || info.State == "" {
			return 2, errors.New(apiMessage(status, body)) // an unknown name, not an absent event
		}
	} else if verb == "forget" && status == http.StatusConflict {
		// the API's answer speaks of ?force=true
		return 2, errors.New(strings.ReplaceAll(apiMessage(status, body), "?force=true", "--force"))
	} else {
		return 2, errors.New(apiMessage(status, body))
	}
	if !asJSON {
		if info.Endpoint != "" {
			name = info.Endpoint // an earlier name of it may have been given
		}
		printEvent(out, verb, name, info)
	}
	if info.State == "absent" {
		return 1, nil
	}
	return 0, nil
}

func printEvent(out io.Writer, verb, name string, info EventInfo) {
	switch {
	case info.State == "absent":
		fmt.Fprintf(out, "%s: no record (never processed, or its record expired)\n", info.ID)
	case verb == "forget":
		fmt.Fprintf(out, "%s: forgotten (it was %s); its next delivery will be processed\n", info.ID, info.State)
	case info.State == "in_flight":
		fmt.Fprintf(out, "%s: in flight (a delivery holds its lease: a backend working on it, or an attempt that was not processed, held until its lease runs out and it becomes fate unknown)\n", info.ID)
	case info.State == "unknown":
		fmt.Fprintf(out, "%s: fate unknown (an attempt's lease ran out before it was settled: its Caddy died, or it was held); the next delivery reaches the backend with Sangho-Dedup-Prior-Attempt: unknown\n", info.ID)
	default:
		fmt.Fprintf(out, "%s: processed\n", info.ID)
	}
	fmt.Fprintf(out, "  endpoint      %s\n", name)
	if info.ProcessedAt != nil {
		fmt.Fprintf(out, "  processed at  %s\n", info.ProcessedAt.Format(time.RFC3339))
	}
	if info.EventType != "" {
		fmt.Fprintf(out, "  event type    %s\n", info.EventType)
	}
	if info.Fingerprint != "" {
		fmt.Fprintf(out, "  fingerprint   %s\n", info.Fingerprint)
	}
	switch {
	case info.ExpiresAt != nil && verb == "get" && info.State == "unknown":
		fmt.Fprintf(out, "  lease ran out %s\n", info.ExpiresAt.Format(time.RFC3339))
	case info.ExpiresAt != nil && verb == "get":
		fmt.Fprintf(out, "  expires at    %s\n", info.ExpiresAt.Format(time.RFC3339))
	}
}

// apiMessage is the message of a Caddy API error answer.
func apiMessage(status int, body []byte) string {
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		return e.Error
	}
	return fmt.Sprintf("HTTP %d: %s", status, strings.TrimSpace(string(body)))
}

// adminClient dials Caddy's admin address (tcp, unix socket) the way
// caddy's own commands do (caddycmd.AdminAPIRequest, which cannot serve
// here: it turns every answer >= 400 into an error string, and a 404
// carries the absent event's JSON). It returns the URL base to request
// and the Origin header to send: none on a unix socket, where Caddy
// refuses a request that carries one.
func adminClient(addr string) (client *http.Client, base, origin string, err error) {
	// An address written as a URL, as a browser or curl takes it: its
	// host and port, whatever the scheme's case and the path.
	if u, err := url.Parse(addr); err == nil && u.Host != "" && strings.Contains(addr, "://") {
		switch {
		case strings.EqualFold(u.Scheme, "https"):
			return nil, "", "", fmt.Errorf("admin address %s: the command speaks plain HTTP or a unix socket, not https:// (Caddy's remote admin, with client certificates); give the local admin address, e.g. --address %s", addr, u.Host)
		case !strings.EqualFold(u.Scheme, "http"):
			return nil, "", "", fmt.Errorf("admin address %s: give host:port (as in Caddy's admin option), a unix socket (unix//path), or http://host:port", addr)
		case u.Port() == "":
			return nil, "", "", fmt.Errorf("admin address %s has no port: give host:port, e.g. --address %s:2019 (Caddy's default admin address is %s)", addr, u.Hostname(), caddy.DefaultAdminListen)
		}
		addr = u.Host
	}
	na, err := caddy.ParseNetworkAddress(addr)
	if err != nil || na.PortRangeSize() > 1 {
		return nil, "", "", fmt.Errorf("invalid admin address %s: %v", addr, err)
	}
	base = "http://" + na.JoinHostPort(0)
	origin = base
	if na.IsUnixNetwork() {
		base, origin = "http://127.0.0.1", ""     // the host is not used, only required
		na.Host, _, _ = strings.Cut(na.Host, "|") // socket permission bits
	}
	return &http.Client{
		Timeout: 15 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, na.Network, na.JoinHostPort(0))
		}},
	}, base, origin, nil
}

// adminDo sends one request to the admin API. A GET whose connection
// was closed or reset before any answer is sent again, at most twice:
// Caddy replaces its admin server on every config load and shuts the
// old one down in the background, and a connection that lands on the
// old one meanwhile (both listen, with SO_REUSEPORT) is dropped
// unanswered. A script that runs `caddy reload` and then this command
// on a busy machine meets it.
func adminDo(client *http.Client, base, origin, method, uri string) (int, []byte, error) {
	req, err := http.NewRequest(method, base+uri, nil)
	if err != nil {
		return 0, nil, err
	}
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	resp, err := client.Do(req)
	for try := 1; err != nil && method == http.MethodGet && try < 3 && droppedUnanswered(err); try++ {
		time.Sleep(100 * time.Millisecond)
		resp, err = client.Do(req)
	}
	if err != nil {
		return 0, nil, fmt.Errorf("reaching Caddy's admin API: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, body, err
}

// droppedUnanswered reports whether a request failed because its
// connection was closed (EOF) or reset before any answer came.
func droppedUnanswered(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
}
