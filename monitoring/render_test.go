package monitoring

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The panel pictures: one PNG per dashboard panel, drawn with the
// standard library from what the real Prometheus of the test answers to
// the panel's queries over the test (query_range, one point a second).
// The test always draws them (into a temporary directory); with
// MONITORING_PANELS=write (make panels) it writes them to panels/, which
// the READMEs show.

const panelsDir = "panels"

var palette = []color.RGBA{
	{31, 119, 180, 255}, {255, 127, 14, 255}, {44, 160, 44, 255}, {214, 39, 40, 255},
	{148, 103, 189, 255}, {140, 86, 75, 255}, {227, 119, 194, 255}, {127, 127, 127, 255},
	{188, 189, 34, 255}, {23, 190, 207, 255}, {0, 0, 128, 255}, {128, 64, 0, 255},
}

// panelFile is the picture of a panel: panels/<id>-<title as a slug>.png.
func panelFile(p panel) string {
	slug := strings.Trim(regexp.MustCompile(`[^a-z0-9]+`).ReplaceAllString(strings.ToLower(p.Title), "-"), "-")
	return fmt.Sprintf("%d-%s.png", p.ID, slug)
}

type line struct {
	legend string
	ts     []float64 // seconds from the start
	vs     []float64
}

var legendVar = regexp.MustCompile(`\{\{\s*(\w+)\s*\}\}`)

func (f *fleet) renderPanels(t *testing.T) {
	dir := t.TempDir()
	if os.Getenv("MONITORING_PANELS") == "write" {
		dir = panelsDir
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	start, end := f.start.Add(-10*time.Second), time.Now()
	for _, p := range loadDashboard(t).Panels {
		var lines []line
		for _, tg := range p.Targets {
			res, err := f.queryRange(grafana(tg.Expr, "10s"), start, end)
			if err != nil {
				t.Errorf("panel %q: %v", p.Title, err)
				continue
			}
			for _, s := range res {
				l := line{legend: legendVar.ReplaceAllStringFunc(tg.LegendFormat, func(m string) string {
					return s.Metric[legendVar.FindStringSubmatch(m)[1]]
				})}
				for _, pt := range s.Values {
					ts, _ := pt[0].(float64)
					v, err := strconv.ParseFloat(fmt.Sprint(pt[1]), 64)
					if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
						continue
					}
					l.ts = append(l.ts, ts-float64(start.Unix()))
					l.vs = append(l.vs, v)
				}
				if len(l.vs) > 0 {
					lines = append(lines, l)
				}
			}
		}
		// Series at zero throughout say nothing and crowd the legend.
		sort.SliceStable(lines, func(i, j int) bool { return slices.Max(lines[i].vs) > slices.Max(lines[j].vs) })
		if k := slices.IndexFunc(lines, func(l line) bool { return slices.Max(l.vs) == 0 }); k > 0 {
			lines = lines[:k]
		}
		if len(lines) == 0 {
			t.Errorf("panel %q: no data to draw", p.Title)
			continue
		}
		img := drawPanel(p.Title, p.FieldConfig.Defaults.Unit, lines, end.Sub(start).Seconds())
		var buf bytes.Buffer
		if err := png.Encode(&buf, img); err != nil {
			t.Fatal(err)
		}
		if _, err := png.Decode(bytes.NewReader(buf.Bytes())); err != nil {
			t.Fatalf("panel %q: the PNG does not decode: %v", p.Title, err)
		}
		if err := os.WriteFile(filepath.Join(dir, panelFile(p)), buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// canvas draws text, lines and rectangles on an RGBA image.
type canvas struct{ *image.RGBA }

const scale = 2 // text: each font pixel is 2x2

func (c canvas) rect(x0, y0, x1, y1 int, col color.Color) {
	for y := y0; y < y1; y++ {
		for x := x0; x < x1; x++ {
			c.Set(x, y, col)
		}
	}
}

func (c canvas) text(x, y int, s string, col color.Color) {
	for _, r := range s {
		g, ok := glyphs[r]
		if !ok {
			g = glyphs['?']
		}
		for row := range 8 {
			for bit := range 5 {
				if g[row]&(1<<(4-bit)) != 0 {
					c.rect(x+bit*scale, y+row*scale, x+(bit+1)*scale, y+(row+1)*scale, col)
				}
			}
		}
		x += 6 * scale
	}
}

func textWidth(s string) int { return len([]rune(s)) * 6 * scale }

// line draws a 2-pixel line from (x0, y0) to (x1, y1).
func (c canvas) line(x0, y0, x1, y1 float64, col color.Color) {
	n := int(math.Max(math.Abs(x1-x0), math.Abs(y1-y0))) + 1
	for i := 0; i <= n; i++ {
		x := x0 + (x1-x0)*float64(i)/float64(n)
		y := y0 + (y1-y0)*float64(i)/float64(n)
		c.rect(int(x), int(y), int(x)+2, int(y)+2, col)
	}
}

// format writes a value in the panel's unit.
func format(v float64, unit string) string {
	switch unit {
	case "percentunit":
		return strconv.FormatFloat(v*100, 'g', 3, 64) + "%"
	case "s":
		if v < 1 {
			return strconv.FormatFloat(v*1000, 'g', 3, 64) + " ms"
		}
		return strconv.FormatFloat(v, 'g', 3, 64) + " s"
	case "reqps", "ops":
		return strconv.FormatFloat(v, 'g', 3, 64) + "/s"
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// niceMax rounds v up to 1, 2 or 5 times a power of ten.
func niceMax(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func drawPanel(title, unit string, lines []line, span float64) image.Image {
	const w, plotH, left, right, top = 1000, 300, 130, 20, 44
	const legendRow = 22
	maxLegend := 16
	shown := min(len(lines), maxLegend)
	legendRows := (shown + 1) / 2
	if len(lines) > maxLegend {
		legendRows++
	}
	h := top + plotH + 40 + legendRows*legendRow + 10
	c := canvas{image.NewRGBA(image.Rect(0, 0, w, h))}
	c.rect(0, 0, w, h, color.RGBA{255, 255, 255, 255})
	ink, grid := color.RGBA{30, 30, 30, 255}, color.RGBA{225, 225, 225, 255}
	c.text(10, 10, title, ink)

	ymax := 0.0
	for _, l := range lines {
		for _, v := range l.vs {
			ymax = math.Max(ymax, v)
		}
	}
	ymax = niceMax(ymax)
	x0, x1, y0, y1 := left, w-right, top+plotH, top // y0 bottom
	for i := 0; i <= 4; i++ {
		y := y0 - (y0-y1)*i/4
		c.rect(x0, y, x1, y+1, grid)
		label := format(ymax*float64(i)/4, unit)
		c.text(x0-8-textWidth(label), y-8, label, ink)
	}
	for i := 0; i <= 6; i++ {
		x := x0 + (x1-x0)*i/6
		c.rect(x, y1, x+1, y0, grid)
		label := fmt.Sprintf("-%.0fs", span*(1-float64(i)/6))
		if i == 6 {
			label = "now"
		}
		c.text(x-textWidth(label)/2, y0+8, label, ink)
	}
	c.rect(x0, y0, x1, y0+1, ink)
	c.rect(x0, y1, x0+1, y0, ink)
	px := func(ts float64) float64 { return float64(x0) + ts/span*float64(x1-x0-2) }
	py := func(v float64) float64 { return float64(y0) - v/ymax*float64(y0-y1-2) - 2 }
	for i, l := range lines {
		col := palette[i%len(palette)]
		for j := range l.vs {
			if j > 0 && l.ts[j]-l.ts[j-1] <= 1.5 {
				c.line(px(l.ts[j-1]), py(l.vs[j-1]), px(l.ts[j]), py(l.vs[j]), col)
			} else {
				c.rect(int(px(l.ts[j])), int(py(l.vs[j])), int(px(l.ts[j]))+3, int(py(l.vs[j]))+3, col)
			}
		}
	}
	ly := y0 + 40
	for i := range shown {
		x := 10 + (i%2)*(w/2)
		y := ly + (i/2)*legendRow
		c.rect(x, y+4, x+20, y+10, palette[i%len(palette)])
		legend := lines[i].legend
		if r := []rune(legend); len(r) > 38 {
			legend = string(r[:37]) + "~"
		}
		c.text(x+28, y, legend, ink)
	}
	if len(lines) > maxLegend {
		c.text(10, ly+(shown+1)/2*legendRow, fmt.Sprintf("and %d more", len(lines)-maxLegend), ink)
	}
	return c
}

// TestPanelPictures: every panel of the dashboard has its picture in
// panels/ (a PNG of a sane size), and the READMEs show each one.
func TestPanelPictures(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	docs, err := os.ReadFile(filepath.Join("..", "docs", "observability.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range loadDashboard(t).Panels {
		name := panelFile(p)
		b, err := os.ReadFile(filepath.Join(panelsDir, name))
		if err != nil {
			t.Errorf("panel %q: %v (make panels draws them)", p.Title, err)
			continue
		}
		img, err := png.Decode(bytes.NewReader(b))
		if err != nil || img.Bounds().Dx() < 500 || img.Bounds().Dy() < 300 {
			t.Errorf("panel %q: %s is not a sane PNG: %v", p.Title, name, err)
		}
		if !bytes.Contains(readme, []byte("panels/"+name)) {
			t.Errorf("monitoring/README.md does not show panels/%s", name)
		}
		if !bytes.Contains(docs, []byte("../monitoring/panels/"+name)) {
			t.Errorf("docs/observability.md does not show panels/%s", name)
		}
	}
}
