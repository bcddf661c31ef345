// Package buildinfo says which packwire this is: the module version and the
// VCS revision and time the go command stamped into the binary
// (runtime/debug.ReadBuildInfo), for `packwire version`, serve's first
// line, the governor's records and /metrics' packwire_build_info.
package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
)

// version, when set at link time (go build -ldflags "-X
// packwire/internal/buildinfo.version=1.2.3", as a distribution package
// may), replaces the module version the go command stamped.
var version string

// Info is what the binary knows of its own build. A field the build did not
// record is empty, except Version, which is then "(devel)" as the go command
// writes it (go test, go run, a build outside a checkout).
type Info struct {
	Version   string // module version: v1.2.3, a pseudo-version, "(devel)"
	Revision  string // VCS commit (full hash)
	Time      string // commit time, RFC 3339 UTC
	Modified  bool   // the work tree had uncommitted changes
	GoVersion string // the toolchain: go1.26.8
}

var (
	once   sync.Once
	cached Info
)

// Get returns this binary's build information, read once.
func Get() Info {
	once.Do(func() {
		bi, _ := debug.ReadBuildInfo()
		cached = fromBuildInfo(bi, version)
	})
	return cached
}

// fromBuildInfo reads bi (nil: none recorded); override, when not empty,
// is the version given at link time.
func fromBuildInfo(bi *debug.BuildInfo, override string) Info {
	info := Info{Version: "(devel)", GoVersion: runtime.Version()}
	if bi != nil {
		if v := bi.Main.Version; v != "" {
			info.Version = v
		}
		if bi.GoVersion != "" {
			info.GoVersion = bi.GoVersion
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.Revision = s.Value
			case "vcs.time":
				info.Time = s.Value
			case "vcs.modified":
				info.Modified = s.Value == "true"
			}
		}
	}
	if override != "" {
		info.Version = override
	}
	return info
}

// ShortRevision is the revision's first 12 hex digits, as git's
// pseudo-versions write it, with "+dirty" when the tree was modified; empty
// when no revision was recorded.
func (i Info) ShortRevision() string {
	r := i.Revision
	if len(r) > 12 {
		r = r[:12]
	}
	if r != "" && i.Modified {
		r += "+dirty"
	}
	return r
}

// String is the one line `packwire version` prints and serve logs:
// "packwire v1.2.3 (revision 0123456789ab, 2026-11-29T10:00:00Z, go1.26.8)";
// what the build did not record is left out.
func (i Info) String() string {
	var details []string
	if r := i.ShortRevision(); r != "" {
		details = append(details, "revision "+r)
	}
	if i.Time != "" {
		details = append(details, i.Time)
	}
	details = append(details, i.GoVersion)
	return "packwire " + i.Version + " (" + strings.Join(details, ", ") + ")"
}
