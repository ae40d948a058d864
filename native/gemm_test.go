package native

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func randomF32(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

// refGEMM is C = A . B (B [k, n]) in float64, with the bound on f32 rounding error per element
// (k * eps * sum |a||b|, which a blocked f32 sum stays within).
func refGEMM(a []float32, m, k int, b []float32, n int) (c, bound []float64) {
	c, bound = make([]float64, m*n), make([]float64, m*n)
	for i := range m {
		for j := range n {
			var s, abs float64
			for q := range k {
				p := float64(a[i*k+q]) * float64(b[q*n+j])
				s += p
				abs += math.Abs(p)
			}
			c[i*n+j], bound[i*n+j] = s, float64(k+2)*0x1p-24*abs+1e-30
		}
	}
	return c, bound
}

func transpose(b []float32, k, n int) []float32 {
	t := make([]float32, len(b))
	for q := range k {
		for j := range n {
			t[j*k+q] = b[q*n+j]
		}
	}
	return t
}

func checkClose(t *testing.T, got []float32, want, bound []float64, what string) {
	t.Helper()
	for i := range want {
		if d := math.Abs(float64(got[i]) - want[i]); !(d <= bound[i]) {
			t.Fatalf("%s: element %d = %g, want %g (error %g > bound %g)", what, i, got[i], want[i], d, bound[i])
		}
	}
}

// Shapes around every blocking edge (tiles 6x16 and 12x32, packed panels of 32 columns,
// KC = 256, MC = 240, row chunks of 96 for 2 threads from 768 rows), every variant,
// packed and per-call forms, bias and accumulation, several thread counts.
func TestGEMMAgainstReference(t *testing.T) {
	r := newRand(t)
	shapes := [][3]int{{1, 1, 1}, {5, 15, 7}, {6, 16, 256}, {7, 17, 257}, {13, 40, 300}, {121, 33, 513}, {250, 70, 64}, {3, 200, 1000}, {12, 32, 256}, {25, 65, 40}, {800, 40, 300}}
	forEachISA(t, func(t *testing.T, isa ISA) {
		for _, s := range shapes {
			m, n, k := s[0], s[1], s[2]
			a, b := randomF32(r, m*k), randomF32(r, k*n)
			bias := randomF32(r, n)
			want, bound := refGEMM(a, m, k, b, n)
			for _, threads := range []int{1, 2, 3} {
				what := fmt.Sprintf("m=%d n=%d k=%d threads=%d", m, n, k, threads)
				opt := GEMMOptions{Threads: threads, ISA: isa}

				c := randomF32(r, m*n) // garbage: must be overwritten
				require.NoError(t, Mul(c, a, m, k, b, n, false, opt))
				checkClose(t, c, want, bound, what+" A.B")
				require.NoError(t, Mul(c, a, m, k, transpose(b, k, n), n, true, opt))
				checkClose(t, c, want, bound, what+" A.(B^T)^T")

				w, err := PackWeights(Matrix{Data: AsBytes(transpose(b, k, n)), DType: F32, Rows: n, Cols: k})
				require.NoError(t, err)
				opt.Bias = bias
				prev := randomF32(r, m*n)
				c = append([]float32(nil), prev...)
				opt.Accumulate = true
				require.NoError(t, MulPacked(c, a, w, opt))
				acc, accBound := make([]float64, m*n), make([]float64, m*n)
				for i := range acc {
					acc[i] = want[i] + float64(bias[i%n]) + float64(prev[i])
					// two more f32 additions, each off by half an ulp of its result
					accBound[i] = bound[i] + 0x1p-23*(math.Abs(want[i])+math.Abs(float64(bias[i%n]))+math.Abs(float64(prev[i])))
				}
				checkClose(t, c, acc, accBound, what+" C += A.W^T + bias")
				w.Free()
			}
		}
	})
}

// Weights in f16 and bf16 are converted exactly when packed.
func TestPackWeightsDTypes(t *testing.T) {
	r := newRand(t)
	m, n, k := 9, 20, 30
	a := randomF32(r, m*k)
	wt := randomF32(r, n*k)
	for _, dt := range []DType{F16, BF16} {
		raw := make([]byte, n*k*dt.Size())
		require.NoError(t, Convert(raw, dt, AsBytes(wt), F32))
		exact := make([]float32, n*k) // the weights as the narrow dtype holds them
		require.NoError(t, Convert(AsBytes(exact), F32, raw, dt))
		w, err := PackWeights(Matrix{Data: raw, DType: dt, Rows: n, Cols: k})
		require.NoError(t, err)
		c := make([]float32, m*n)
		require.NoError(t, MulPacked(c, a, w, GEMMOptions{Threads: 1}))
		want, bound := refGEMM(a, m, k, transpose(exact, n, k), n)
		checkClose(t, c, want, bound, dt.String())
		w.Free()
	}
}

func TestGEMMErrors(t *testing.T) {
	w, err := PackWeights(Matrix{Data: make([]byte, 4*6), DType: F32, Rows: 2, Cols: 3})
	require.NoError(t, err)
	defer w.Free()
	require.ErrorContains(t, MulPacked(make([]float32, 4), make([]float32, 5), w, GEMMOptions{}), "not whole rows of 3")
	require.ErrorContains(t, MulPacked(make([]float32, 3), make([]float32, 6), w, GEMMOptions{}), "C holds 3 values, [2, 2] needs 4")
	require.ErrorContains(t, MulPacked(make([]float32, 4), make([]float32, 6), w, GEMMOptions{Bias: []float32{1}}), "bias has 1 values")
	require.ErrorContains(t, Mul(make([]float32, 4), make([]float32, 3), 2, 3, make([]float32, 6), 2, false, GEMMOptions{}), "too short")
	_, err = PackWeights(Matrix{Data: make([]byte, 4), DType: F32, Rows: 2, Cols: 3})
	require.ErrorIs(t, err, ErrInvalid)
}

// Several goroutines multiply at once (encoder batches run beside other requests): the C
// fan-out's worker pool is shared by all of them, and each result must still be right.
func TestGEMMConcurrentCallers(t *testing.T) {
	r := newRand(t)
	m, n, k := 100, 96, 200 // ~3.8 MFLOP: fans out to 3 threads
	wt := randomF32(r, n*k)
	w, err := PackWeights(Matrix{Data: AsBytes(wt), DType: F32, Rows: n, Cols: k})
	require.NoError(t, err)
	defer w.Free()
	const callers = 6
	as := make([][]float32, callers)
	wants, bounds := make([][]float64, callers), make([][]float64, callers)
	for g := range callers {
		as[g] = randomF32(r, m*k)
		wants[g], bounds[g] = refGEMM(as[g], m, k, transpose(wt, n, k), n)
	}
	errs := make(chan error, callers)
	for g := range callers {
		go func() {
			c := make([]float32, m*n)
			for it := range 30 {
				clear(c)
				if err := MulPacked(c, as[g], w, GEMMOptions{Threads: 2 + (g+it)%3}); err != nil {
					errs <- err
					return
				}
				for i := range c {
					if d := math.Abs(float64(c[i]) - wants[g][i]); !(d <= bounds[g][i]) {
						errs <- fmt.Errorf("caller %d call %d: element %d = %g, want %g", g, it, i, c[i], wants[g][i])
						return
					}
				}
			}
			errs <- nil
		}()
	}
	for range callers {
		require.NoError(t, <-errs)
	}
}
