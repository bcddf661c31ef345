package bench

import (
	"fmt"
	"strconv"
	"strings"
)

// Scenario is one operation of the clone/fetch study.
type Scenario struct {
	ID    string // T1..T10
	Name  string
	Short string // a column header: "shallow", "fetch→blobless"
	// Clone holds the clone options: of the measured clone for T1-T4, of
	// the prepared clone the fetches go into for T5-T10.
	Clone []string
	// Fetch is set for T5-T10, which time `git fetch` (with FetchArgs)
	// and then `git reset --hard origin/<branch>`.
	Fetch     bool
	FetchArgs []string
}

// Command is the measured git command line, for tables and the report.
func (s Scenario) Command() string {
	if !s.Fetch {
		return strings.TrimSpace("git clone " + strings.Join(s.Clone, " "))
	}
	return strings.TrimSpace("git fetch " + strings.Join(s.FetchArgs, " "))
}

// Scenarios are the study's ten operations, in its order.
var Scenarios = []Scenario{
	{ID: "T1", Name: "full clone", Short: "full"},
	{ID: "T2", Name: "shallow clone", Short: "shallow", Clone: []string{"--depth", "1"}},
	{ID: "T3", Name: "treeless clone", Short: "treeless", Clone: []string{"--filter=tree:0"}},
	{ID: "T4", Name: "blobless clone", Short: "blobless", Clone: []string{"--filter=blob:none"}},
	{ID: "T5", Name: "full fetch into a full clone", Short: "fetch→full", Fetch: true},
	{ID: "T6", Name: "shallow fetch into a full clone", Short: "shallow fetch→full", Fetch: true, FetchArgs: []string{"--depth", "1"}},
	{ID: "T7", Name: "full fetch into a shallow clone", Short: "fetch→shallow", Clone: []string{"--depth", "1"}, Fetch: true},
	{ID: "T8", Name: "shallow fetch into a shallow clone", Short: "shallow fetch→shallow", Clone: []string{"--depth", "1"}, Fetch: true, FetchArgs: []string{"--depth", "1"}},
	{ID: "T9", Name: "full fetch into a treeless clone", Short: "fetch→treeless", Clone: []string{"--filter=tree:0"}, Fetch: true},
	{ID: "T10", Name: "full fetch into a blobless clone", Short: "fetch→blobless", Clone: []string{"--filter=blob:none"}, Fetch: true},
}

// Lookup returns the scenario with this id (case-insensitive).
func Lookup(id string) (Scenario, bool) {
	for _, s := range Scenarios {
		if strings.EqualFold(s.ID, id) {
			return s, true
		}
	}
	return Scenario{}, false
}

// ParseScenarios reads a list like "T1,T3", "T5-T10", "clones", "fetches"
// or "all" and returns the scenarios in the study's order, each once.
func ParseScenarios(list string) ([]Scenario, error) {
	want := make([]bool, len(Scenarios))
	any := false
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		switch strings.ToLower(item) {
		case "":
			continue
		case "all":
			for i := range want {
				want[i] = true
			}
		case "clones":
			for i := 0; i < 4; i++ {
				want[i] = true
			}
		case "fetches":
			for i := 4; i < len(want); i++ {
				want[i] = true
			}
		default:
			from, to, isRange := strings.Cut(item, "-")
			a, err := scenarioIndex(from)
			if err != nil {
				return nil, err
			}
			b := a
			if isRange {
				if b, err = scenarioIndex(to); err != nil {
					return nil, err
				}
				if b < a {
					return nil, fmt.Errorf("scenario range %q runs backwards", item)
				}
			}
			for i := a; i <= b; i++ {
				want[i] = true
			}
		}
		any = true
	}
	if !any {
		return nil, fmt.Errorf("no scenarios in %q (want e.g. T1,T2 or T5-T10 or all)", list)
	}
	var out []Scenario
	for i, w := range want {
		if w {
			out = append(out, Scenarios[i])
		}
	}
	return out, nil
}

func scenarioIndex(id string) (int, error) {
	id = strings.TrimSpace(id)
	if len(id) >= 2 && (id[0] == 'T' || id[0] == 't') {
		if n, err := strconv.Atoi(id[1:]); err == nil && n >= 1 && n <= len(Scenarios) && id[1] != '+' && id[1] != '0' {
			return n - 1, nil
		}
	}
	return 0, fmt.Errorf("unknown scenario %q (the study's are T1 to T10)", id)
}
