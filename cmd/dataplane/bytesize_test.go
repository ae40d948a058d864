package main

import "testing"

func TestParseBytes(t *testing.T) {
	f := func(in string, want int64) {
		t.Helper()
		got, err := parseBytes(in)
		if err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
		if back, err := parseBytes(formatBytes(got)); err != nil || back != got {
			t.Errorf("%q: formatted %q reads back as %d", in, formatBytes(got), back)
		}
	}
	f("1073741824", 1<<30)
	f("1GiB", 1<<30)
	f("64MiB", 64<<20)
	f(" 3 KiB ", 3<<10)
	f("12B", 12)
	f("0", 0)
	for _, bad := range []string{"", "-1", "1.5GiB", "1GB", "64M", "99999999TiB", "x"} {
		if _, err := parseBytes(bad); err == nil {
			t.Errorf("parseBytes(%q) took it", bad)
		}
	}
}
