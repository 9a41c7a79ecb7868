package bench

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
)

const (
	plotW     = 800
	plotH     = 260
	plotPad   = 50
	plotGap   = 40
	plotTotal = 2*plotH + plotGap + 2*plotPad
)

var plotColors = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"}

// WritePlot draws, per job clone, bandwidth over time (top) and the
// completion-latency histogram of every clone merged (bottom), as SVG.
func WritePlot(w io.Writer, res *Result) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n",
		plotW+2*plotPad, plotTotal)
	fmt.Fprintf(bw, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")

	// Bandwidth over time.
	type series struct {
		name string
		pts  [][2]float64 // seconds, MiB/s
	}
	var ss []series
	var maxT, maxBW float64
	var lat Histogram
	for _, g := range res.Groups {
		for _, jr := range g.Jobs {
			lat.Merge(&jr.Read.Clat)
			lat.Merge(&jr.Write.Clat)
			s := series{name: fmt.Sprintf("%s.%d", jr.Job.Name, jr.Clone)}
			var pt float64
			var pb uint64
			for _, smp := range jr.Samples {
				t := smp.T.Seconds()
				b := smp.ReadBytes + smp.WriteBytes
				if t-pt < 0.01 {
					continue
				}
				v := float64(b-min(b, pb)) / (t - pt) / (1 << 20)
				s.pts = append(s.pts, [2]float64{t, v})
				maxT, maxBW = math.Max(maxT, t), math.Max(maxBW, v)
				pt, pb = t, b
			}
			ss = append(ss, s)
		}
	}
	if maxT == 0 {
		maxT = 1
	}
	if maxBW == 0 {
		maxBW = 1
	}
	x0, y0 := float64(plotPad), float64(plotPad)
	axes(bw, x0, y0, "bandwidth (MiB/s) over time (s)", maxT, maxBW)
	for i, s := range ss {
		if len(s.pts) == 0 {
			continue
		}
		c := plotColors[i%len(plotColors)]
		fmt.Fprintf(bw, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="`, c)
		for _, p := range s.pts {
			fmt.Fprintf(bw, "%.1f,%.1f ", x0+p[0]/maxT*plotW, y0+plotH-p[1]/maxBW*plotH)
		}
		fmt.Fprint(bw, "\"/>\n")
		fmt.Fprintf(bw, `<text x="%.0f" y="%.0f" fill="%s">%s</text>`+"\n", x0+plotW-150, y0+14+float64(i)*13, c, html.EscapeString(s.name))
	}

	// Latency histogram: bars on a log2 x axis of nanoseconds.
	y1 := y0 + plotH + plotGap
	type bar struct{ lo, hi, c float64 }
	var bars []bar
	var maxC float64
	lat.Buckets(func(lo, width, count uint64) {
		bars = append(bars, bar{float64(lo), float64(lo + width), float64(count)})
		maxC = math.Max(maxC, float64(count))
	})
	if len(bars) == 0 {
		fmt.Fprintf(bw, `<text x="%.0f" y="%.0f">no completions</text>`+"\n", x0, y1+20)
	} else {
		lmin := math.Log2(math.Max(1, bars[0].lo))
		lmax := math.Log2(bars[len(bars)-1].hi)
		if lmax-lmin < 1 {
			lmax = lmin + 1
		}
		fmt.Fprintf(bw, `<text x="%.0f" y="%.0f">completion latency histogram (count; x: log scale, %s to %s)</text>`+"\n",
			x0, y1-6, fmtNs(bars[0].lo), fmtNs(bars[len(bars)-1].hi))
		fmt.Fprintf(bw, `<rect x="%.0f" y="%.0f" width="%d" height="%d" fill="none" stroke="#888"/>`+"\n", x0, y1, plotW, plotH)
		for _, b := range bars {
			xa := x0 + (math.Log2(math.Max(1, b.lo))-lmin)/(lmax-lmin)*plotW
			xb := x0 + (math.Log2(b.hi)-lmin)/(lmax-lmin)*plotW
			h := b.c / maxC * plotH
			fmt.Fprintf(bw, `<rect x="%.2f" y="%.2f" width="%.2f" height="%.2f" fill="#1f77b4"/>`+"\n", xa, y1+plotH-h, math.Max(0.5, xb-xa), h)
		}
		for _, p := range []float64{50, 99, 99.9} {
			v := float64(lat.Percentile(p))
			x := x0 + (math.Log2(math.Max(1, v))-lmin)/(lmax-lmin)*plotW
			fmt.Fprintf(bw, `<line x1="%.1f" x2="%.1f" y1="%.0f" y2="%.0f" stroke="#d62728" stroke-dasharray="3,3"/>`+"\n", x, x, y1, y1+plotH)
			fmt.Fprintf(bw, `<text x="%.1f" y="%.0f" fill="#d62728">p%g=%s</text>`+"\n", x+2, y1+12, p, fmtNs(v))
		}
	}
	fmt.Fprint(bw, "</svg>\n")
	return bw.Flush()
}

func axes(w io.Writer, x0, y0 float64, title string, maxX, maxY float64) {
	fmt.Fprintf(w, `<text x="%.0f" y="%.0f">%s</text>`+"\n", x0, y0-6, html.EscapeString(title))
	fmt.Fprintf(w, `<rect x="%.0f" y="%.0f" width="%d" height="%d" fill="none" stroke="#888"/>`+"\n", x0, y0, plotW, plotH)
	for i := 0; i <= 4; i++ {
		y := y0 + plotH - float64(i)/4*plotH
		fmt.Fprintf(w, `<text x="%.0f" y="%.0f" text-anchor="end">%.0f</text>`+"\n", x0-4, y+4, maxY*float64(i)/4)
		x := x0 + float64(i)/4*plotW
		fmt.Fprintf(w, `<text x="%.0f" y="%.0f" text-anchor="middle">%.1f</text>`+"\n", x, y0+plotH+14, maxX*float64(i)/4)
	}
}

func fmtNs(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.1fms", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1fµs", v/1e3)
	}
	return fmt.Sprintf("%.0fns", v)
}
