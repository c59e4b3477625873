package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/bits"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// JSON output is the proto3 JSON mapping of the API messages: lowerCamelCase
// field names, every field present (zero values included), 64-bit integers as
// strings. protojson deliberately varies its whitespace between builds, so
// the bytes are re-indented here to keep the output stable for scripts.
var jsonOptions = protojson.MarshalOptions{EmitUnpopulated: true}

// writeJSON writes m as one indented JSON object.
func writeJSON(w io.Writer, m proto.Message) error {
	b, err := jsonOptions.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode json: %w", err)
	}
	return writeIndented(w, b)
}

// writeJSONList writes ms as one JSON array of objects; an empty list is [].
func writeJSONList[M proto.Message](w io.Writer, ms []M) error {
	var buf bytes.Buffer
	buf.WriteByte('[')
	for i, m := range ms {
		if i > 0 {
			buf.WriteByte(',')
		}
		b, err := jsonOptions.Marshal(m)
		if err != nil {
			return fmt.Errorf("encode json: %w", err)
		}
		buf.Write(b)
	}
	buf.WriteByte(']')
	return writeIndented(w, buf.Bytes())
}

func writeIndented(w io.Writer, b []byte) error {
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return fmt.Errorf("encode json: %w", err)
	}
	out.WriteByte('\n')
	_, err := w.Write(out.Bytes())
	return err
}

// table writes aligned columns under an upper-case header, kubectl style.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)}
	t.row(header...)
	return t
}

// row adds one line; empty cells print as "-" so columns stay readable.
func (t *table) row(cells ...string) {
	for i, c := range cells {
		if c == "" {
			cells[i] = "-"
		}
	}
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

func (t *table) flush() error { return t.tw.Flush() }

// details writes "Key:  value" lines with the values aligned.
type details struct{ tw *tabwriter.Writer }

func newDetails(w io.Writer) *details {
	return &details{tw: tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)}
}

func (d *details) field(key, value string) {
	if value == "" {
		value = "-"
	}
	fmt.Fprintf(d.tw, "%s:\t%s\n", key, value)
}

func (d *details) flush() error { return d.tw.Flush() }

// list joins values with ", " for a table cell or detail line.
func list(vs []string) string { return strings.Join(vs, ", ") }

func itoa[T ~uint32 | ~uint64](n T) string { return strconv.FormatUint(uint64(n), 10) }

// count formats an address count. Counts up to 2^32 print exactly; larger
// ones (IPv6) print as the nearest power of two, "~2^64".
func count(n uint64) string {
	if n <= 1<<32 {
		return itoa(n)
	}
	exp := bits.Len64(n) - 1
	// Round to the nearer power: n >= 1.5 * 2^exp rounds up.
	if n>>(exp-1)&1 == 1 {
		exp++
	}
	return "~2^" + strconv.Itoa(exp)
}

// capacity formats a pool's address capacity per family. A dual-stack pool
// names the families: "254 v4, ~2^64 v6".
func capacity(v4, v6 uint64) string {
	switch {
	case v4 == 0 && v6 == 0:
		return "0"
	case v6 == 0:
		return count(v4)
	case v4 == 0:
		return count(v6)
	}
	return count(v4) + " v4, " + count(v6) + " v6"
}

// free is a pool's capacity, both families together, less what is used.
// It saturates rather than wrap.
func free(v4, v6, used uint64) uint64 {
	total, carry := bits.Add64(v4, v6, 0)
	if carry != 0 {
		total = ^uint64(0)
	}
	if used > total {
		return 0
	}
	return total - used
}

// age formats how long ago an RFC 3339 timestamp was, in the largest unit
// that keeps it short: 45s, 12m, 5h, 3d, 2y.
func age(created string, now time.Time) string {
	if created == "" {
		return ""
	}
	t, err := time.Parse(time.RFC3339, created)
	if err != nil {
		return "?"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "0s"
	case d < 2*time.Minute:
		return strconv.Itoa(int(d.Seconds())) + "s"
	case d < 2*time.Hour:
		return strconv.Itoa(int(d.Minutes())) + "m"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d.Hours())) + "h"
	case d < 2*365*24*time.Hour:
		return strconv.Itoa(int(d.Hours()/24)) + "d"
	}
	return strconv.Itoa(int(d.Hours()/24/365)) + "y"
}

// shortID is how container IDs appear in tables, as docker and kubectl show them.
func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
