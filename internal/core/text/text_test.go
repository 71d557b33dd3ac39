package text_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/intentd/intentd/internal/core/text"
)

func TestCut(t *testing.T) {
	for _, tc := range []struct {
		name, s string
		n       int
		want    string
	}{
		{"short", "refund", 1024, "refund"},
		{"exactly", "abcd", 4, "abcd"},
		{"ascii", "abcdef", 4, "abcd"},
		{"a character is not split", "ab€", 4, "ab"}, // € is 3 bytes
		{"at a boundary", "a€b", 4, "a€"},
		{"nothing fits", "€", 2, ""},
		{"invalid bytes become U+FFFD", "a\xffb", 1024, "a\uFFFDb"},
		{"empty", "", 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := text.Cut(tc.s, tc.n)
			if got != tc.want || len(got) > tc.n && tc.n >= len(tc.want) || !utf8.ValidString(got) {
				t.Errorf("Cut(%q, %d) = %q; want %q", tc.s, tc.n, got, tc.want)
			}
		})
	}
	long := strings.Repeat("€", 2000)
	if got := text.Cut(long, 1024); len(got) != 1023 || !utf8.ValidString(got) {
		t.Errorf("2,000 € cut to 1,024 bytes: %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
}
