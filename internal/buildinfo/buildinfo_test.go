package buildinfo

import (
	"runtime/debug"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	stamped := &debug.BuildInfo{
		GoVersion: "go1.26.8",
		Main:      debug.Module{Path: "packwire", Version: "v0.0.0-20261129101500-9039c04abcde"},
		Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: "9039c04abcdef0123456789abcdef0123456789a"},
			{Key: "vcs.time", Value: "2026-11-29T10:15:00Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	for _, tc := range []struct {
		name     string
		bi       *debug.BuildInfo
		override string
		want     string
	}{
		{"stamped", stamped, "", "packwire v0.0.0-20261129101500-9039c04abcde (revision 9039c04abcde+dirty, 2026-11-29T10:15:00Z, go1.26.8)"},
		{"link-time version", stamped, "1.2.3", "packwire 1.2.3 (revision 9039c04abcde+dirty, 2026-11-29T10:15:00Z, go1.26.8)"},
		{"go test: no version, no VCS", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "packwire", Version: "(devel)"}}, "", "packwire (devel) (go1.26.8)"},
		{"empty main version", &debug.BuildInfo{GoVersion: "go1.26.8"}, "", "packwire (devel) (go1.26.8)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fromBuildInfo(tc.bi, tc.override).String(); got != tc.want {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
	if got := fromBuildInfo(nil, ""); got.Version != "(devel)" || got.GoVersion == "" || got.Revision != "" {
		t.Errorf("no build info: %+v, want (devel), the running Go version and no revision", got)
	}
}
