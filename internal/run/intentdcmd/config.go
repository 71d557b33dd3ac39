package intentdcmd

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"

	"github.com/intentd/intentd/internal/run/cliflag"
	"github.com/intentd/intentd/internal/run/tracing"
)

// configFlag names the optional config file. Its keys are the flags'
// names without the dashes, its values what the flag takes:
//
//	listen: 0.0.0.0:7650
//	etcd-endpoints: [https://etcd-0:2379, https://etcd-1:2379]
//	retention: 720h
//
// A flag on the command line wins over its environment variable, which
// wins over the file, which wins over the default.
const configFlag = "config"

// settle sets the flags the command line left unset, from the
// environment, then from the config file (whose name may itself come from
// INTENTD_CONFIG), and last --otlp-endpoint from OpenTelemetry's variables.
func settle(fs *pflag.FlagSet) error {
	if err := fromEnv(fs); err != nil {
		return err
	}
	if path := fs.Lookup(configFlag).Value.String(); path != "" {
		if err := fromFile(fs, path); err != nil {
			return err
		}
	}
	return otlpFromOTel(fs)
}

// otlpFromOTel sets --otlp-endpoint, when nothing else did, from
// OpenTelemetry's standard variables, as every OpenTelemetry SDK reads
// them: the traces-only one first.
func otlpFromOTel(fs *pflag.FlagSet) error {
	if fs.Changed("otlp-endpoint") {
		return nil
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		if v := os.Getenv(name); v != "" {
			if err := tracing.ParseEndpoint(v); err != nil {
				return fmt.Errorf("%s (--otlp-endpoint) %q: %v", name, v, err)
			}
			return fs.Set("otlp-endpoint", v)
		}
	}
	return nil
}

// fromFile sets every flag neither the command line nor the environment
// set from the YAML config file at path. An unknown key, a key given
// twice, or a bad value is an error naming the file and the key: a typo
// must not leave a setting silently at its default.
func fromFile(fs *pflag.FlagSet, path string) error {
	return fromFileWith(fs, path, "intentd's flag names, e.g. etcd-endpoints", nil)
}

// fromFileWith is fromFile for a command whose file also holds keys that
// are no flag: extra reads each (its value as JSON); keys says in words
// what the keys are, for the error of an unknown one.
func fromFileWith(fs *pflag.FlagSet, path, keysAre string, extra map[string]func(json.RawMessage) error) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--%s: %w", configFlag, err)
	}
	// Strict: a key given twice is an error, not the last one winning.
	j, err := yaml.YAMLToJSONStrict(b)
	if err != nil {
		// One line: the parser's errors span several.
		return fmt.Errorf("--%s %s: %s", configFlag, path, strings.Join(strings.Fields(err.Error()), " "))
	}
	var keys map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.UseNumber()
	if err := dec.Decode(&keys); err != nil {
		return fmt.Errorf("--%s %s: want a mapping of flag names to values: %w", configFlag, path, err)
	}
	names := make([]string, 0, len(keys))
	for k := range keys {
		names = append(names, k)
	}
	slices.Sort(names) // the first error is the same from run to run
	for _, k := range names {
		where := fmt.Sprintf("--%s %s: key %q", configFlag, path, k)
		if read, ok := extra[k]; ok {
			if err := read(keys[k]); err != nil {
				return fmt.Errorf("--%s %s: %v", configFlag, path, err)
			}
			continue
		}
		f := fs.Lookup(k)
		if f == nil || k == configFlag || k == "help" {
			return fmt.Errorf("%s: unknown key; the keys are %s", where, keysAre)
		}
		v, err := flagValue(keys[k])
		if err != nil {
			return fmt.Errorf("%s: %v", where, err)
		}
		if isList(keys[k]) && !strings.HasSuffix(f.Value.Type(), "Slice") {
			return fmt.Errorf("%s: want one value, not a list", where)
		}
		if f.Changed {
			continue // given on the command line or in the environment
		}
		if fs.Set(k, v) != nil {
			return cliflag.BadValue(where, v, f)
		}
	}
	return nil
}

// flagValue is a config file value as the flag's text: scalars as
// written, a list as comma-separated values.
func flagValue(raw json.RawMessage) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "", err
	}
	switch v := v.(type) {
	case string:
		return v, nil
	case json.Number:
		return v.String(), nil
	case bool:
		return fmt.Sprint(v), nil
	case []any:
		parts := make([]string, 0, len(v))
		for _, e := range v {
			s, err := flagValue(mustJSON(e))
			if err != nil {
				return "", err
			}
			if _, isList := e.([]any); isList {
				return "", fmt.Errorf("want a list of values, not of lists")
			}
			parts = append(parts, s)
		}
		return strings.Join(parts, ","), nil
	case nil:
		return "", fmt.Errorf("no value; leave the key out for the default")
	}
	return "", fmt.Errorf("want a value or a list of values, not a mapping")
}

// isList reports whether raw is a JSON array.
func isList(raw json.RawMessage) bool {
	return len(bytes.TrimSpace(raw)) > 0 && bytes.TrimSpace(raw)[0] == '['
}

func mustJSON(v any) json.RawMessage {
	b, _ := json.Marshal(v) // v came out of json.Decode: it encodes
	return b
}
