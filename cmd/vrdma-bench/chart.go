package main

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// The chart: bandwidth (GB/s, linear y) against message size (log2 x),
// one line per series, axes with ticks and labels, and a legend. Text is
// drawn with a 3×5 pixel font scaled up, so no font dependency is needed.

const (
	chartW, chartH = 900, 540
	marginL        = 80
	marginR        = 30
	marginT        = 50
	marginB        = 70
	fontScale      = 2
)

var (
	white = color.RGBA{255, 255, 255, 255}
	black = color.RGBA{0, 0, 0, 255}
	grid  = color.RGBA{225, 225, 225, 255}
	// series colours: WRITE, READ, memcpy (the scaling chart: aggregate,
	// one pair, target; orange for clients that never yield)
	seriesColor = []color.RGBA{{214, 39, 40, 255}, {31, 119, 180, 255}, {90, 90, 90, 255}}
	orange      = color.RGBA{255, 127, 14, 255}
	seriesName  = []string{"RDMA WRITE", "RDMA READ", "MEMCPY (1 THREAD)"}
)

// glyphs are 3 columns × 5 rows; each string is 5 rows of 3 bits.
var glyphs = map[rune][5]string{
	'0': {"111", "101", "101", "101", "111"}, '1': {"010", "110", "010", "010", "111"},
	'2': {"111", "001", "111", "100", "111"}, '3': {"111", "001", "111", "001", "111"},
	'4': {"101", "101", "111", "001", "001"}, '5': {"111", "100", "111", "001", "111"},
	'6': {"111", "100", "111", "101", "111"}, '7': {"111", "001", "010", "010", "010"},
	'8': {"111", "101", "111", "101", "111"}, '9': {"111", "101", "111", "001", "111"},
	'A': {"010", "101", "111", "101", "101"}, 'B': {"110", "101", "110", "101", "110"},
	'C': {"011", "100", "100", "100", "011"}, 'D': {"110", "101", "101", "101", "110"},
	'E': {"111", "100", "110", "100", "111"}, 'F': {"111", "100", "110", "100", "100"},
	'G': {"011", "100", "101", "101", "011"}, 'H': {"101", "101", "111", "101", "101"},
	'I': {"111", "010", "010", "010", "111"}, 'K': {"101", "101", "110", "101", "101"},
	'L': {"100", "100", "100", "100", "111"}, 'M': {"101", "111", "111", "101", "101"},
	'N': {"110", "101", "101", "101", "101"}, 'O': {"010", "101", "101", "101", "010"},
	'P': {"110", "101", "110", "100", "100"}, 'R': {"110", "101", "110", "101", "101"},
	'S': {"011", "100", "010", "001", "110"}, 'T': {"111", "010", "010", "010", "010"},
	'U': {"101", "101", "101", "101", "111"}, 'V': {"101", "101", "101", "101", "010"},
	'W': {"101", "101", "111", "111", "101"}, 'Y': {"101", "101", "010", "010", "010"},
	'Z': {"111", "001", "010", "100", "111"}, 'X': {"101", "101", "010", "101", "101"},
	'.': {"000", "000", "000", "000", "010"}, '/': {"001", "001", "010", "100", "100"},
	'(': {"010", "100", "100", "100", "010"}, ')': {"010", "001", "001", "001", "010"},
	'-': {"000", "000", "111", "000", "000"}, ',': {"000", "000", "000", "010", "100"},
	' ': {"000", "000", "000", "000", "000"},
}

type canvas struct{ *image.RGBA }

func (c canvas) rect(x0, y0, x1, y1 int, col color.RGBA) {
	for y := max(0, y0); y < min(chartH, y1); y++ {
		for x := max(0, x0); x < min(chartW, x1); x++ {
			c.SetRGBA(x, y, col)
		}
	}
}

// line draws a thick line by stepping along it.
func (c canvas) line(x0, y0, x1, y1 float64, w int, col color.RGBA) {
	n := int(math.Max(math.Abs(x1-x0), math.Abs(y1-y0))) + 1
	for i := 0; i <= n; i++ {
		t := float64(i) / float64(n)
		x, y := int(x0+(x1-x0)*t), int(y0+(y1-y0)*t)
		c.rect(x-w/2, y-w/2, x-w/2+w, y-w/2+w, col)
	}
}

// text draws s (upper-cased) with its top-left corner at (x, y).
func (c canvas) text(x, y int, s string, col color.RGBA) {
	for _, r := range strings.ToUpper(s) {
		g, ok := glyphs[r]
		if !ok {
			g = glyphs[' ']
		}
		for row := range 5 {
			for bit := range 3 {
				if g[row][bit] == '1' {
					c.rect(x+bit*fontScale, y+row*fontScale, x+(bit+1)*fontScale, y+(row+1)*fontScale, col)
				}
			}
		}
		x += 4 * fontScale
	}
}

func textWidth(s string) int { return len([]rune(s)) * 4 * fontScale }

// series is one line (or, with marksOnly, a set of markers) of a plot.
type series struct {
	name      string
	color     color.RGBA
	xs, ys    []float64 // xs in the plot's x unit (already log2 where the axis is)
	marksOnly bool
}

// tick is a labelled x position.
type tick struct {
	x     float64
	label string
}

// plot is a chart: linear y from 0, x as the caller maps it.
type plot struct {
	title, xLabel, yLabel string
	ticks                 []tick
	series                []series
}

// drawChart renders the bandwidth chart.
func drawChart(pts []bwPoint) *image.RGBA {
	p := plot{title: "VRDMA BANDWIDTH, TWO DEVICES IN ONE DAEMON, AGAINST MEMCPY",
		xLabel: "message size (log2 scale)", yLabel: "GB/S"}
	for i, get := range []func(bwPoint) float64{
		func(p bwPoint) float64 { return p.write },
		func(p bwPoint) float64 { return p.read },
		func(p bwPoint) float64 { return p.memcp },
	} {
		sr := series{name: seriesName[i], color: seriesColor[i]}
		for _, pt := range pts {
			sr.xs, sr.ys = append(sr.xs, math.Log2(float64(pt.size))), append(sr.ys, get(pt))
		}
		p.series = append(p.series, sr)
	}
	for _, pt := range pts {
		p.ticks = append(p.ticks, tick{math.Log2(float64(pt.size)), strings.ReplaceAll(sizeName(pt.size), " ", "")})
	}
	return p.draw()
}

// draw renders p.
func (p plot) draw() *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, chartW, chartH))
	c := canvas{img}
	c.rect(0, 0, chartW, chartH, white)
	if len(p.ticks) == 0 {
		return img
	}
	ymax := 0.0
	lo, hi := p.ticks[0].x, p.ticks[0].x
	for _, t := range p.ticks {
		lo, hi = math.Min(lo, t.x), math.Max(hi, t.x)
	}
	for _, sr := range p.series {
		for i, y := range sr.ys {
			ymax = math.Max(ymax, y)
			lo, hi = math.Min(lo, sr.xs[i]), math.Max(hi, sr.xs[i])
		}
	}
	// Headroom above the data for the legend (top left, 20 px a series
	// in a plot of chartH-marginT-marginB).
	ymax *= 1 + float64(len(p.series)*20+30)/float64(chartH-marginT-marginB)
	step := niceStep(ymax / 5)
	ymax = math.Max(step, math.Ceil(ymax/step)*step)
	x0, x1 := float64(marginL), float64(chartW-marginR)
	y0, y1 := float64(chartH-marginB), float64(marginT)
	if hi == lo {
		hi = lo + 1
	}
	px := func(x float64) float64 { return x0 + (x-lo)/(hi-lo)*(x1-x0) }
	py := func(v float64) float64 { return y0 - v/ymax*(y0-y1) }
	// grid and y ticks
	for v := 0.0; v <= ymax+step/2; v += step {
		y := int(py(v))
		c.rect(int(x0), y, int(x1), y+1, grid)
		l := fmtNum(v)
		c.text(int(x0)-8-textWidth(l), y-5, l, black)
	}
	// x ticks
	for _, t := range p.ticks {
		x := int(px(t.x))
		c.rect(x, int(y1), x+1, int(y0), grid)
		c.rect(x, int(y0), x+1, int(y0)+6, black)
		c.text(x-textWidth(t.label)/2, int(y0)+12, t.label, black)
	}
	// axes
	c.rect(int(x0), int(y1), int(x0)+2, int(y0)+1, black)
	c.rect(int(x0), int(y0), int(x1), int(y0)+2, black)
	c.text(int(x0+x1)/2-textWidth(p.xLabel)/2, chartH-28, p.xLabel, black)
	c.text(10, marginT-30, p.yLabel, black)
	c.text(chartW/2-textWidth(p.title)/2, 12, p.title, black)
	for _, sr := range p.series {
		for i := range sr.xs {
			x, y := px(sr.xs[i]), py(sr.ys[i])
			c.rect(int(x)-4, int(y)-4, int(x)+4, int(y)+4, sr.color)
			if i > 0 && !sr.marksOnly {
				c.line(px(sr.xs[i-1]), py(sr.ys[i-1]), x, y, 3, sr.color)
			}
		}
	}
	// legend (top left inside the plot)
	lx, ly := int(x0)+20, int(y1)+12
	wide := 0
	for _, sr := range p.series {
		wide = max(wide, textWidth(sr.name))
	}
	c.rect(lx-8, ly-8, lx+wide+50, ly+len(p.series)*20, white)
	for i, sr := range p.series {
		c.rect(lx, ly+i*20+3, lx+24, ly+i*20+7, sr.color)
		c.text(lx+32, ly+i*20, sr.name, black)
	}
	return img
}

// niceStep rounds x up to 1, 2 or 5 times a power of ten.
func niceStep(x float64) float64 {
	if x <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= x {
			return m * p
		}
	}
	return 10 * p
}

func writeChart(path string, pts []bwPoint) error { return writePNG(path, drawChart(pts)) }

func writePNG(path string, img image.Image) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

// scalingPNG is the scaling chart's file name, beside the bandwidth chart.
const scalingPNG = "benchmarks-scaling.png"

// drawScalingChart renders aggregate bandwidth against busy pairs (log2
// x) beside each count's one-pair baseline and issue 14's targets; a point of
// clients that never yield (pairs < 0 in pts) is drawn as a marker.
func drawScalingChart(pts []scalePoint) *image.RGBA {
	p := plot{title: "AGGREGATE 64 KIB RDMA WRITE, N DEVICE PAIRS OF ONE DAEMON AT ONCE",
		xLabel: "busy pairs (log2 scale)", yLabel: "GB/S"}
	agg := series{name: "AGGREGATE", color: seriesColor[0]}
	base := series{name: "ONE PAIR (BASELINE)", color: seriesColor[2]}
	tgt := series{name: "TARGET (ISSUE 14)", color: seriesColor[1], marksOnly: true}
	spin := series{name: "CLIENTS THAT NEVER YIELD", color: orange, marksOnly: true}
	for _, pt := range pts {
		if pt.pairs < 0 {
			spin.xs, spin.ys = append(spin.xs, math.Log2(float64(-pt.pairs))), append(spin.ys, pt.agg)
			continue
		}
		x := math.Log2(float64(pt.pairs))
		p.ticks = append(p.ticks, tick{x, fmt.Sprint(pt.pairs)})
		agg.xs, agg.ys = append(agg.xs, x), append(agg.ys, pt.agg)
		base.xs, base.ys = append(base.xs, x), append(base.ys, pt.one)
		if t, ok := scalingTargets[pt.pairs]; ok {
			tgt.xs, tgt.ys = append(tgt.xs, x), append(tgt.ys, t*pt.one)
		}
	}
	for _, sr := range []series{agg, base, tgt, spin} {
		if len(sr.xs) > 0 {
			p.series = append(p.series, sr)
		}
	}
	return p.draw()
}

func writeScalingChart(path string, pts []scalePoint) error {
	return writePNG(path, drawScalingChart(pts))
}

// drawLossChart renders the roce section's picture: 64 KiB WRITE goodput
// against the loss rate of one path, the QP sprayed over sprayPaths paths
// and on the lossy path alone. The loss rates are spread evenly on x (not
// to scale: they span 0 to 5 %).
func drawLossChart(pts []lossPoint) *image.RGBA {
	p := plot{title: fmt.Sprintf("64 KIB RDMA WRITE GOODPUT, LOSS ON 1 OF %d PATHS", sprayPaths),
		xLabel: "loss rate of the lossy path, percent (not to scale)", yLabel: "GBIT/S"}
	spray := series{name: fmt.Sprintf("SPRAYED OVER %d PATHS", sprayPaths), color: seriesColor[0]}
	plain := series{name: "ONE PATH, GO-BACK-N (THE LOSSY ONE)", color: seriesColor[2]}
	for i, pt := range pts {
		x := float64(i)
		p.ticks = append(p.ticks, tick{x, lossLabel(pt.loss)})
		spray.xs, spray.ys = append(spray.xs, x), append(spray.ys, pt.spray)
		plain.xs, plain.ys = append(plain.xs, x), append(plain.ys, pt.plain)
	}
	p.series = []series{spray, plain}
	return p.draw()
}
