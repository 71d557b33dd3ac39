// Package cliflag words flag errors for people: the flag, the value, and
// what the flag wants, without the parser's internals ("strconv.ParseInt:
// parsing "x": invalid syntax"). intentd and intentctl share it so that a
// bad value reads the same in both.
package cliflag

import (
	"errors"
	"fmt"

	"github.com/spf13/pflag"
)

// wants says, by pflag type name, what a value must look like.
var wants = map[string]string{
	"duration":    "a duration such as 500ms, 90s, 15m or 720h",
	"int":         "a whole number",
	"int32":       "a whole number",
	"uint64":      "a whole number, 0 or more",
	"float64":     "a number such as 500 or 0.5",
	"bool":        "true or false",
	"stringSlice": "comma-separated values",
}

// BadValue is the error for value given to flag f; where names its source:
// "--retention", or "INTENTD_RETENTION (--retention)".
func BadValue(where, value string, f *pflag.Flag) error {
	want, ok := wants[f.Value.Type()]
	if !ok {
		want = "a " + f.Value.Type()
	}
	return fmt.Errorf("%s %q: not valid, want %s", where, value, want)
}

// Explain rewrites pflag's invalid-value error with BadValue and returns
// every other error as it is (pflag's own texts for unknown flags and
// missing values already name the flag plainly).
func Explain(err error) error {
	var bad *pflag.InvalidValueError
	if errors.As(err, &bad) {
		return BadValue("--"+bad.GetFlag().Name, bad.GetValue(), bad.GetFlag())
	}
	return err
}
