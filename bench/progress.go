package bench

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// IsTerminal reports whether f is a terminal (the progress line is drawn
// only then).
func IsTerminal(f *os.File) bool {
	if f == nil {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// ProgressWriter returns f when it is a terminal and nil otherwise: the
// value for Runner.Progress.
func ProgressWriter(f *os.File) io.Writer {
	if IsTerminal(f) {
		return f
	}
	return nil
}

// progress draws fio's one-line status: jobs running, percent done, current
// bandwidth and IOPS, ETA. Only the group's sampler goroutine uses it.
type progress struct {
	w       io.Writer
	workers []*worker
	start   time.Time
	last    time.Time
	lastR   uint64
	lastW   uint64
	width   int
}

func newProgress(w io.Writer, ws []*worker) *progress {
	if w == nil {
		return nil
	}
	now := time.Now()
	return &progress{w: w, workers: ws, start: now, last: now}
}

// expected is how long the group should take, 0 if unknown (size bound).
func (p *progress) expected() time.Duration {
	var d time.Duration
	for _, w := range p.workers {
		if w.job.Runtime > 0 {
			d = max(d, w.job.RampTime+w.job.Runtime)
		}
	}
	return d
}

func (p *progress) update(now time.Time) {
	var rb, wb, issued, total uint64
	running := 0
	for _, w := range p.workers {
		rb += w.readBytes.Load()
		wb += w.writeBytes.Load()
		if !w.job.TimeBased {
			issued += w.issued.Load() * w.job.BSMin
			total += w.job.Size
		}
		running++
	}
	dt := now.Sub(p.last).Seconds()
	if dt <= 0 {
		return
	}
	rbw := float64(rb-min(rb, p.lastR)) / dt
	wbw := float64(wb-min(wb, p.lastW)) / dt
	p.last, p.lastR, p.lastW = now, rb, wb
	el := now.Sub(p.start)
	frac := 0.0
	var eta time.Duration
	if exp := p.expected(); exp > 0 {
		frac = min(1, float64(el)/float64(exp))
		eta = max(0, exp-el)
	}
	if total > 0 && issued > 0 {
		f := min(1, float64(issued)/float64(total))
		if frac == 0 || f > frac {
			frac = f
			eta = time.Duration(float64(el) * (1 - f) / f)
		}
	}
	line := fmt.Sprintf("Jobs: %d: [%.1f%% done] [r=%s/s,w=%s/s] [eta %s]", running, frac*100,
		humanBytes(rbw), humanBytes(wbw), fmtETA(eta))
	pad := ""
	if len(line) < p.width {
		pad = strings.Repeat(" ", p.width-len(line))
	}
	p.width = len(line)
	fmt.Fprintf(p.w, "\r%s%s", line, pad)
}

func (p *progress) finish() {
	fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", p.width))
}

func fmtETA(d time.Duration) string {
	s := int64(d.Round(time.Second) / time.Second)
	if s >= 3600 {
		return fmt.Sprintf("%02dh:%02dm:%02ds", s/3600, s/60%60, s%60)
	}
	return fmt.Sprintf("%02dm:%02ds", s/60, s%60)
}

// humanBytes prints a byte count with binary units (fio's style: MiB).
func humanBytes(v float64) string {
	return scaledBytes(v, 1024, []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"})
}

// scaledBytes prints v in the largest of units (each base times the last)
// that keeps it at least 1, with one decimal past bytes.
func scaledBytes(v, base float64, units []string) string {
	i := 0
	for v >= base && i < len(units)-1 {
		v /= base
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f%s", v, units[i])
	}
	return fmt.Sprintf("%.1f%s", v, units[i])
}
