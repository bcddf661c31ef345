package bench

import (
	"strings"
	"testing"
)

func ids(list []Scenario) string {
	var out []string
	for _, s := range list {
		out = append(out, s.ID)
	}
	return strings.Join(out, ",")
}

func TestParseScenarios(t *testing.T) {
	for in, want := range map[string]string{
		"all":         "T1,T2,T3,T4,T5,T6,T7,T8,T9,T10",
		"T1":          "T1",
		"t10,T1":      "T1,T10",
		"T5-T10":      "T5,T6,T7,T8,T9,T10",
		"T2, T2 ,T3":  "T2,T3",
		"clones":      "T1,T2,T3,T4",
		"fetches,T1":  "T1,T5,T6,T7,T8,T9,T10",
		"T3-T3,":      "T3",
		"T1,T3-T4,T9": "T1,T3,T4,T9",
	} {
		got, err := ParseScenarios(in)
		if err != nil || ids(got) != want {
			t.Errorf("ParseScenarios(%q) = %s, %v; want %s", in, ids(got), err, want)
		}
	}
	for _, bad := range []string{"", ",", "T0", "T11", "T", "X1", "T5-T2", "T1-", "T01", "T+1", "1", "T1-T99"} {
		if got, err := ParseScenarios(bad); err == nil {
			t.Errorf("ParseScenarios(%q) = %s, want an error", bad, ids(got))
		}
	}
}

func FuzzParseScenarios(f *testing.F) {
	for _, s := range []string{"all", "T1,T2", "T5-T10", "clones,fetches", "T10-T1", "t3", ",,", "T1-T2-T3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got, err := ParseScenarios(in)
		if err != nil {
			if got != nil {
				t.Fatalf("error with scenarios: %v", err)
			}
			return
		}
		if len(got) == 0 || len(got) > len(Scenarios) {
			t.Fatalf("%q: %d scenarios", in, len(got))
		}
		// In the study's order, each once, and each one Lookup knows.
		last := -1
		for _, s := range got {
			i, err := scenarioIndex(s.ID)
			if err != nil || i <= last {
				t.Fatalf("%q: %s out of order or unknown", in, ids(got))
			}
			last = i
			if _, ok := Lookup(s.ID); !ok {
				t.Fatalf("%s not found", s.ID)
			}
		}
	})
}
