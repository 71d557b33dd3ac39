// Package text cuts free text to the byte limits of the API's fields.
// intent.proto counts bytes of UTF-8 (a reason at most 1,024, an external
// reference at most 256), and protobuf refuses a string field that is not
// UTF-8 at all, so text that came from anywhere (an error message, a
// downstream's answer) is made valid and cut at a character boundary.
package text

import (
	"strings"
	"unicode/utf8"
)

// Cut is s as valid UTF-8 (each invalid byte sequence becomes U+FFFD) in
// at most n bytes, cut at a character boundary.
func Cut(s string, n int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
