package providers

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestCheckUnixTimeCanonical: a Unix timestamp is accepted in its one
// canonical form only: digits, no leading zero, no sign, no space. A
// leading zero is what let the review's replay move a digit from the ID
// into the timestamp.
func TestCheckUnixTimeCanonical(t *testing.T) {
	now := time.Unix(1733140800, 0)
	ts := strconv.FormatInt(now.Unix(), 10)
	for in, want := range map[string]error{
		ts:                    nil,
		"0" + ts:              errSigMalformed,
		"00" + ts:             errSigMalformed,
		"+" + ts:              errSigMalformed,
		" " + ts:              errSigMalformed,
		ts + " ":              errSigMalformed,
		"":                    errSigMalformed,
		"0":                   errSigTimestamp, // canonical, long ago
		"1" + ts:              errSigTimestamp,
		"9999999999999999999": errSigMalformed, // over int64
	} {
		if err := checkUnixTime(in, now, 5*time.Minute); !errors.Is(err, want) {
			t.Errorf("%q: %v, want %v", in, err, want)
		}
	}
}

// TestHMACTemplateSeparation: signed_content is refused where the signed
// bytes do not say where each of {id}, {timestamp} and {body} ends: read
// from the body outwards, each part needs a character it cannot hold (an
// ID: letters, digits, _ and -; a Unix timestamp: digits) between it and
// its neighbour towards the body, or a pair of parts kept apart needs
// one that neither holds beyond them. An RFC 3339 timestamp keeps itself
// apart. The error names signed_content and the two parts.
func TestHMACTemplateSeparation(t *testing.T) {
	for _, c := range []struct {
		format, template, idField string
		refused                   string // the parts named, "" if accepted
	}{
		{"unix", "{id}{timestamp}{body}", "", "{id} and {timestamp}"},
		{"unix", "{id}.{timestamp}{body}", "", "{timestamp} and {body}"},
		{"unix", "{timestamp}{body}", "id", "{timestamp} and {body}"},
		{"unix", "{body}{timestamp}", "id", "{body} and {timestamp}"},
		{"unix", "{id}7{timestamp}.{body}", "", "{id} and {timestamp}"},
		{"unix", "{timestamp}{timestamp}.{body}", "id", "{timestamp} and {timestamp}"},
		{"", "{id}{body}", "", "{id} and {body}"},
		{"", "{body}{id}", "", "{body} and {id}"},
		{"", "{body}-{id}", "", "{body} and {id}"},
		{"", "{id}_a-{body}", "", "{id} and {body}"},
		{"rfc3339", "{id}{body}{timestamp}", "", "{id} and {body}"},
		// Each pair is kept apart, but the whole is not: body 1, time 2 and
		// ID 3-x sign the same bytes as body 1-2, time 3 and ID x.
		{"unix", "{body}-{timestamp}-{id}", "", "{timestamp} and {id}"},
		{"unix", "{id}-{timestamp}-{body}", "", "{id} and {timestamp}"},
		{"unix", "{body}_{timestamp}_{id}", "", "{timestamp} and {id}"},

		{"unix", "{id}.{timestamp}.{body}", "", ""},
		{"unix", "{id}-{timestamp}:{body}", "", ""}, // '-' is not a digit, ':' in neither ID nor timestamp
		{"unix", "v0:{timestamp}:{body}", "id", ""},
		{"unix", "{timestamp}.{body}", "id", ""},
		{"", "{body}", "id", ""},
		{"", "{body}|end", "id", ""},
		{"", "{body}.{id}", "", ""},
		{"rfc3339", "{id}{timestamp}{body}", "", ""},
		{"rfc3339", "{timestamp}{body}", "id", ""},
		{"rfc3339", "{body}{timestamp}{id}", "", ""},
		{"unix", "{body}-{timestamp}.{id}", "", ""},
		{"unix", "{body}.{timestamp}-{id}", "", ""}, // the last '.' ends the body
		{"unix", "{id}_{timestamp}.{body}", "", ""},
		{"unix", "{timestamp}.{timestamp}.{body}", "id", ""},
		{"rfc3339", "{body}-{timestamp}-{id}", "", ""},
	} {
		s := &HMAC{Header: "X-Sig", SignedContent: c.template, IDField: c.idField}
		if c.idField == "" {
			s.IDHeader = "X-Id"
		}
		if c.format != "" {
			s.TimestampHeader, s.TimestampFormat = "X-Ts", c.format
		}
		err := s.setup()
		switch {
		case c.refused == "" && err != nil:
			t.Errorf("%s %q: %v, want accepted", c.format, c.template, err)
		case c.refused != "" && (err == nil || !strings.HasPrefix(err.Error(), fmt.Sprintf("signed_content %q: %s are not kept apart", c.template, c.refused))):
			t.Errorf("%s %q: %v, want refused for %s", c.format, c.template, err, c.refused)
		}
	}
	for _, c := range []struct{ header, format, want string }{
		{"X-Ts", "iso", `timestamp_format must be unix or rfc3339, not "iso"`},
		{"", "rfc3339", "timestamp_format is set but there is no timestamp_header"},
	} {
		s := &HMAC{Header: "X-Sig", IDField: "id", TimestampHeader: c.header, TimestampFormat: c.format}
		if c.header != "" {
			s.SignedContent = "{timestamp}.{body}"
		}
		if err := s.setup(); err == nil || err.Error() != c.want {
			t.Errorf("timestamp_header %q timestamp_format %q: %v, want %s", c.header, c.format, err, c.want)
		}
	}
}

// TestCheckRFC3339Time: the strict RFC 3339 form only, within tolerance.
func TestCheckRFC3339Time(t *testing.T) {
	now := time.Date(2019, 11, 16, 10, 11, 12, 634234626, time.UTC)
	for in, want := range map[string]error{
		"2019-11-16T10:11:12.634234626Z":      nil,
		"2019-11-16T10:11:12Z":                nil,
		"2019-11-16T10:11:12.6Z":              nil,
		"2019-11-16T11:11:12.634234626+01:00": nil,
		"2019-11-16T09:11:12-01:00":           nil,
		"2019-11-16T10:05:12Z":                errSigTimestamp,
		"2019-11-16T10:17:13Z":                errSigTimestamp,
		"02019-11-16T10:11:12Z":               errSigMalformed, // a character moved in from before
		"019-11-16T10:11:12Z":                 errSigMalformed, // or out
		"2019-11-16T10:11:12Z0":               errSigMalformed,
		"2019-11-16T10:11:12":                 errSigMalformed, // no zone
		"2019-11-16t10:11:12z":                errSigMalformed,
		"2019-11-16 10:11:12Z":                errSigMalformed,
		"2019-11-16T10:11:12.Z":               errSigMalformed,
		"2019-11-16T10:11:12.6342346261Z":     errSigMalformed, // 10 fraction digits
		"2019-11-16T10:11:12+0100":            errSigMalformed,
		"2019-11-16T10:11:12+01":              errSigMalformed,
		"2019-13-16T10:11:12Z":                errSigMalformed,
		"2019-11-16T24:11:12Z":                errSigMalformed,
		"1573899072":                          errSigMalformed,
		"":                                    errSigMalformed,
	} {
		if err := checkRFC3339Time(in, now, 5*time.Minute); !errors.Is(err, want) {
			t.Errorf("%q: %v, want %v", in, err, want)
		}
	}
}

// TestCheckTimeIsExact: the tolerance of the hmac and standard_webhooks
// providers is exact, in either direction: the edge is inside, a
// millisecond beyond it is not, and a tolerance is not cut to whole
// seconds (as TestToleranceIsExact checks for sangho and stripe).
func TestCheckTimeIsExact(t *testing.T) {
	signed := time.Unix(1733140800, 0)
	for _, c := range []struct {
		tolerance, off time.Duration // off: this server's clock minus the signed time
		ok             bool
	}{
		{5 * time.Minute, 0, true},
		{5 * time.Minute, 5 * time.Minute, true},
		{5 * time.Minute, -5 * time.Minute, true},
		{5 * time.Minute, 5*time.Minute + time.Millisecond, false},
		{5 * time.Minute, -5*time.Minute - time.Millisecond, false},
		{5 * time.Minute, 5*time.Minute + time.Second, false},
		{500 * time.Millisecond, 500 * time.Millisecond, true},
		{500 * time.Millisecond, 600 * time.Millisecond, false},
		{500 * time.Millisecond, -600 * time.Millisecond, false},
		{1900 * time.Millisecond, 1950 * time.Millisecond, false},
	} {
		err := checkTime(signed, signed.Add(c.off), c.tolerance)
		if c.ok && err != nil || !c.ok && !errors.Is(err, errSigTimestamp) {
			t.Errorf("tolerance %v, clock t%+v: %v, want ok=%v", c.tolerance, c.off, err, c.ok)
		}
	}
	// Through a provider: a Unix timestamp exactly 5 minutes old is in.
	ts := strconv.FormatInt(signed.Unix(), 10)
	if err := checkUnixTime(ts, signed.Add(5*time.Minute), 5*time.Minute); err != nil {
		t.Errorf("a timestamp at the edge of the window: %v", err)
	}
}
