package synth

import (
	"fmt"
	"time"
)

// shape describes one of the study's repositories: its object counts at
// scale 1 (git-sizer's figures from the study), the layout of its tree, and
// how its history branches.
type shape struct {
	name                  string
	commits, trees, blobs int // the study's counts at scale 1
	diskMB                int // the study's size on disk, for the help text
	files                 int // files in a checkout of main at scale 1
	initialFiles          float64
	start, end            time.Time

	// Branching: a fraction of commits are merges of topic branches that
	// carry topicLength commits on average; release branches fork from main
	// late in history and get backports and point-release tags.
	mergeFraction         float64
	topicLength           float64
	maxTopics             int // topic branches open at once
	keepMerged            int // merged topic branches left as refs, at scale 1
	releaseBranches       int // at scale 1 (at least one at any scale)
	releaseCommitFraction float64
	tags                  int // annotated tags at scale 1 (at least two at any scale)

	symlinkFraction float64 // of added files
	identStyle      identStyle
	areas           []area
	rootFiles       []rootFile
	mainTag         func(n int) string
	releaseBranch   func(r int) string
	releaseTag      func(r, n int) string
	subjectPrefix   bool // "area: subject" commit subjects (linux)
	signedOff       bool // Signed-off-by trailers (linux)
}

// area is a top-level directory (or the root itself, path "") and how
// files are laid out below it. Files are placed by a random walk: below
// minDepth the walk always descends, at maxDepth it always stops, in
// between it stops with probability stop. At each level it picks an
// existing subdirectory in proportion to the files under it, or a new one
// with weight alpha (a Chinese restaurant process: a few big directories,
// a long tail of small ones, as in real trees).
type area struct {
	path       string
	weight     float64 // share of the repository's files
	minDepth   int
	maxDepth   int
	stop       float64
	alpha      float64
	levels     [][]string // directory names to use first, per level below the area
	langs      []weighted
	sizeMedian int     // bytes
	sizeSigma  float64 // of the log-normal size distribution
	bigChance  float64 // chance a file is a large one (100 KB - 1 MB)
	hot        float64 // popularity multiplier of the area's files
}

// rootFile is a fixed file at the top of the tree (README, Makefile, ...).
// share is the fraction of all file changes that touch it.
type rootFile struct {
	name  string
	lang  string
	size  int
	share float64
}

type weighted struct {
	name   string
	weight float64
}

var shapes = map[string]*shape{
	"jquery": {
		name: "jquery", commits: 7873, trees: 22579, blobs: 14779, diskMB: 40,
		files: 360, initialFiles: 0.2,
		start: time.Date(2006, 3, 22, 15, 33, 7, 0, time.UTC), end: time.Date(2020, 12, 1, 0, 0, 0, 0, time.UTC),
		mergeFraction: 0.04, topicLength: 2, maxTopics: 4, keepMerged: 8,
		releaseBranches: 4, releaseCommitFraction: 0.03, tags: 160,
		identStyle: camelCase,
		areas: []area{
			{path: "src", weight: 0.28, minDepth: 0, maxDepth: 1, stop: 0.45, alpha: 2,
				levels:     [][]string{{"core", "ajax", "attributes", "css", "data", "deferred", "effects", "event", "exports", "manipulation", "queue", "traversing", "var"}},
				langs:      []weighted{{"js", 1}},
				sizeMedian: 2600, sizeSigma: 1.0, bigChance: 0.01, hot: 2.5},
			{path: "test", weight: 0.46, minDepth: 1, maxDepth: 3, stop: 0.55, alpha: 2,
				levels: [][]string{{"unit", "data", "integration", "node_smoke_tests", "manual"},
					{"ajax", "core", "css", "dimensions", "event", "manipulation", "offset", "selector", "support", "testinit"}},
				langs:      []weighted{{"js", 0.5}, {"html", 0.3}, {"json", 0.07}, {"css", 0.06}, {"php", 0.04}, {"xml", 0.03}},
				sizeMedian: 1400, sizeSigma: 1.1, bigChance: 0.01, hot: 1.2},
			{path: "build", weight: 0.07, minDepth: 0, maxDepth: 1, stop: 0.5, alpha: 1,
				levels:     [][]string{{"tasks", "release", "fixtures"}},
				langs:      []weighted{{"js", 0.8}, {"sh", 0.2}},
				sizeMedian: 2000, sizeSigma: 0.8, hot: 0.8},
			{path: "external", weight: 0.07, minDepth: 1, maxDepth: 2, stop: 0.7, alpha: 1.5,
				levels:     [][]string{{"qunit", "sinon", "requirejs", "npo", "jquery-migrate", "core-js"}},
				langs:      []weighted{{"js", 0.8}, {"css", 0.1}, {"txt", 0.1}},
				sizeMedian: 9000, sizeSigma: 1.2, bigChance: 0.08, hot: 0.3},
			{path: "speed", weight: 0.04, minDepth: 0, maxDepth: 1, stop: 0.6, alpha: 1,
				levels:     [][]string{{"benchmark", "benchmarks"}},
				langs:      []weighted{{"html", 0.5}, {"js", 0.5}},
				sizeMedian: 3000, sizeSigma: 0.9, hot: 0.3},
		},
		rootFiles: []rootFile{
			{"package.json", "json", 1800, 0.04}, {"Gruntfile.js", "js", 7000, 0.02}, {"AUTHORS.txt", "txt", 9000, 0.012},
			{"README.md", "md", 12000, 0.006}, {"CONTRIBUTING.md", "md", 6000, 0.002}, {".mailmap", "txt", 3000, 0.004},
			{"LICENSE.txt", "txt", 1100, 0.001}, {".gitignore", "txt", 200, 0.002}, {".jshintrc", "json", 400, 0.001},
			{".travis.yml", "txt", 300, 0.002}, {"bower.json", "json", 500, 0.001}, {".editorconfig", "txt", 300, 0.0005},
		},
		mainTag:       func(n int) string { return fmt.Sprintf("%d.%d.%d", 1+n/40, n/5%8, n%5) },
		releaseBranch: func(r int) string { return fmt.Sprintf("%d.x-stable", r+1) },
		releaseTag:    func(r, n int) string { return fmt.Sprintf("%d.%d.%d-stable", r+1, 12+n/9, n%9+1) },
	},
	"swift": {
		name: "swift", commits: 132316, trees: 649322, blobs: 390116, diskMB: 750,
		files: 24000, initialFiles: 0.15,
		start: time.Date(2010, 7, 17, 18, 5, 11, 0, time.UTC), end: time.Date(2020, 12, 1, 0, 0, 0, 0, time.UTC),
		mergeFraction: 0.2, topicLength: 2.2, maxTopics: 8, keepMerged: 60,
		releaseBranches: 20, releaseCommitFraction: 0.05, tags: 3000,
		symlinkFraction: 0.002, identStyle: camelCase,
		areas: []area{
			{path: "lib", weight: 0.19, minDepth: 1, maxDepth: 2, stop: 0.75, alpha: 2.5,
				levels: [][]string{{"AST", "Sema", "SILGen", "SILOptimizer", "IRGen", "Parse", "Serialization", "Frontend", "Driver", "Basic", "ClangImporter", "IDE", "Immediate", "Demangling", "SIL", "Index", "Markup", "Migrator", "PrintAsObjC", "Syntax", "TBDGen", "LLVMPasses", "RemoteAST", "Option", "FrontendTool"},
					{"Transforms", "Analysis", "Utils", "Mandatory", "IPO", "LoopTransforms", "SILCombiner", "Differentiation", "ARC", "PassManager"}},
				langs:      []weighted{{"cpp", 0.86}, {"h", 0.1}, {"cmake", 0.04}},
				sizeMedian: 11000, sizeSigma: 1.0, bigChance: 0.02, hot: 1.6},
			{path: "include", weight: 0.07, minDepth: 2, maxDepth: 3, stop: 0.85, alpha: 0.6,
				levels: [][]string{{"swift", "swift-c"},
					{"AST", "SIL", "Basic", "Parse", "Sema", "Frontend", "IRGen", "Runtime", "Demangling", "ABI", "SILOptimizer", "Serialization", "ClangImporter", "Driver", "IDE", "Syntax", "Remote", "Reflection"}},
				langs:      []weighted{{"h", 0.9}, {"def", 0.1}},
				sizeMedian: 8000, sizeSigma: 1.0, bigChance: 0.01, hot: 1.3},
			{path: "test", weight: 0.37, minDepth: 1, maxDepth: 3, stop: 0.7, alpha: 4,
				levels: [][]string{{"SILGen", "Sema", "IRGen", "Serialization", "Interpreter", "stdlib", "SILOptimizer", "decl", "expr", "type", "attr", "Parse", "ClangImporter", "Constraints", "Generics", "IDE", "Index", "ModuleInterface", "NameLookup", "Runtime", "SourceKit", "Driver", "DebugInfo", "Frontend", "AutoDiff", "Concurrency", "multifile", "Prototypes", "Misc", "PrintAsObjC"},
					{"Inputs", "Outputs", "lit", "Mocks"}},
				langs:      []weighted{{"swift", 0.84}, {"sil", 0.1}, {"h", 0.03}, {"json", 0.03}},
				sizeMedian: 2400, sizeSigma: 1.0, bigChance: 0.003, hot: 0.9},
			{path: "validation-test", weight: 0.08, minDepth: 1, maxDepth: 3, stop: 0.7, alpha: 2,
				levels:     [][]string{{"compiler_crashers", "compiler_crashers_fixed", "stdlib", "Evolution", "SIL", "IDE", "Sema", "execution", "Serialization", "Python", "BuildSystem"}},
				langs:      []weighted{{"swift", 0.95}, {"py", 0.05}},
				sizeMedian: 1200, sizeSigma: 1.0, hot: 0.5},
			{path: "stdlib", weight: 0.11, minDepth: 2, maxDepth: 3, stop: 0.7, alpha: 1.5,
				levels: [][]string{{"public", "private", "tools", "cmake", "linux", "include"},
					{"core", "runtime", "SDK", "Platform", "SwiftShims", "Reflection", "Darwin", "Differentiation", "Concurrency", "StdlibUnittest", "SwiftOnoneSupport", "stubs"}},
				langs:      []weighted{{"swift", 0.7}, {"cpp", 0.15}, {"h", 0.1}, {"cmake", 0.05}},
				sizeMedian: 9000, sizeSigma: 1.1, bigChance: 0.02, hot: 1.2},
			{path: "utils", weight: 0.05, minDepth: 0, maxDepth: 2, stop: 0.5, alpha: 2,
				levels:     [][]string{{"swift_build_support", "gyb_syntax_support", "vim", "update_checkout", "bug_reducer", "scale-test", "api_checker", "build_swift", "jobstats"}},
				langs:      []weighted{{"py", 0.6}, {"sh", 0.2}, {"txt", 0.2}},
				sizeMedian: 5000, sizeSigma: 1.1, bigChance: 0.02, hot: 1},
			{path: "docs", weight: 0.03, minDepth: 0, maxDepth: 1, stop: 0.6, alpha: 1,
				levels:     [][]string{{"proposals", "archive", "SIL", "ABI", "contents"}},
				langs:      []weighted{{"md", 0.6}, {"rst", 0.4}},
				sizeMedian: 9000, sizeSigma: 1.0, bigChance: 0.03, hot: 0.6},
			{path: "unittests", weight: 0.04, minDepth: 1, maxDepth: 2, stop: 0.8, alpha: 1,
				levels:     [][]string{{"AST", "Basic", "Parse", "runtime", "Syntax", "Driver", "IDE", "Sema", "SourceKit", "Reflection"}},
				langs:      []weighted{{"cpp", 0.9}, {"cmake", 0.1}},
				sizeMedian: 6000, sizeSigma: 0.9, hot: 0.7},
			{path: "tools", weight: 0.04, minDepth: 1, maxDepth: 3, stop: 0.6, alpha: 1.5,
				levels:     [][]string{{"SourceKit", "swift-ide-test", "sil-opt", "swift-demangle", "driver", "swift-api-digester", "libSwiftScan", "swift-reflection-dump"}},
				langs:      []weighted{{"cpp", 0.7}, {"h", 0.1}, {"swift", 0.15}, {"cmake", 0.05}},
				sizeMedian: 7000, sizeSigma: 1.0, bigChance: 0.01, hot: 0.8},
			{path: "benchmark", weight: 0.02, minDepth: 1, maxDepth: 2, stop: 0.8, alpha: 1,
				levels:     [][]string{{"single-source", "multi-source", "utils", "cmake"}},
				langs:      []weighted{{"swift", 0.9}, {"py", 0.1}},
				sizeMedian: 4000, sizeSigma: 0.9, hot: 0.5},
		},
		rootFiles: []rootFile{
			{"CMakeLists.txt", "cmake", 40000, 0.012}, {"CHANGELOG.md", "md", 60000, 0.006}, {"README.md", "md", 9000, 0.002},
			{"LICENSE.txt", "txt", 11000, 0.0002}, {".gitignore", "txt", 900, 0.001}, {"CODE_OWNERS.TXT", "txt", 2500, 0.001},
			{"CONTRIBUTING.md", "md", 1500, 0.0003}, {".clang-format", "txt", 60, 0.0001}, {".flake8", "txt", 1200, 0.0003},
		},
		mainTag: func(n int) string {
			return fmt.Sprintf("swift-DEVELOPMENT-SNAPSHOT-%d-%02d-%02d-a", 2015+n/300, 1+n/25%12, 1+n%25)
		},
		releaseBranch: func(r int) string { return fmt.Sprintf("release/%d.%d", 2+r/4, r%4) },
		releaseTag:    func(r, n int) string { return fmt.Sprintf("swift-%d.%d.%d-RELEASE", 2+r/4, r%4, n+1) },
	},
	"linux": {
		name: "linux", commits: 968500, trees: 4619864, blobs: 2174798, diskMB: 4000,
		files: 70000, initialFiles: 0.25,
		start: time.Date(2005, 4, 16, 22, 20, 36, 0, time.UTC), end: time.Date(2020, 12, 1, 0, 0, 0, 0, time.UTC),
		mergeFraction: 0.075, topicLength: 8, maxTopics: 12, keepMerged: 0,
		releaseBranches: 2, releaseCommitFraction: 0.004, tags: 800,
		symlinkFraction: 0.001, identStyle: snakeCase, subjectPrefix: true, signedOff: true,
		areas: []area{
			{path: "drivers", weight: 0.48, minDepth: 1, maxDepth: 5, stop: 0.42, alpha: 4,
				levels: [][]string{{"net", "gpu", "usb", "staging", "scsi", "media", "mtd", "input", "i2c", "spi", "pinctrl", "clk", "iio", "hid", "hwmon", "misc", "mmc", "tty", "video", "power", "regulator", "rtc", "soc", "infiniband", "crypto", "pci", "acpi", "block", "char", "dma", "firmware", "gpio", "irqchip", "leds", "mfd", "nvme", "phy", "platform", "remoteproc", "thermal", "watchdog", "xen", "virtio", "vfio", "md", "edac", "cpufreq", "base", "bluetooth", "ata", "isdn"},
					{"ethernet", "wireless", "drm", "host", "core", "gadget", "serial", "common", "controllers", "chips", "touchscreen", "keyboard", "busses"}},
				langs:      []weighted{{"c", 0.78}, {"h", 0.18}, {"kconfig", 0.02}, {"make", 0.02}},
				sizeMedian: 9000, sizeSigma: 1.1, bigChance: 0.01, hot: 1},
			{path: "arch", weight: 0.19, minDepth: 2, maxDepth: 4, stop: 0.5, alpha: 2,
				levels: [][]string{{"x86", "arm", "arm64", "powerpc", "mips", "sparc", "s390", "riscv", "sh", "parisc", "ia64", "m68k", "alpha", "xtensa", "openrisc", "microblaze", "nios2", "csky", "arc", "hexagon", "um"},
					{"kernel", "mm", "boot", "include", "lib", "configs", "crypto", "platforms", "kvm", "net", "pci", "power", "mach-omap2", "mach-imx"}},
				langs:      []weighted{{"c", 0.4}, {"h", 0.3}, {"asm", 0.1}, {"dts", 0.17}, {"make", 0.03}},
				sizeMedian: 6000, sizeSigma: 1.1, bigChance: 0.005, hot: 0.9},
			{path: "include", weight: 0.08, minDepth: 1, maxDepth: 2, stop: 0.75, alpha: 0.8,
				levels:     [][]string{{"linux", "uapi", "net", "asm-generic", "sound", "media", "trace", "drm", "scsi", "soc", "dt-bindings", "crypto", "acpi", "xen", "rdma", "kvm", "clocksource", "misc", "keys", "video", "target", "vdso"}},
				langs:      []weighted{{"h", 1}},
				sizeMedian: 5000, sizeSigma: 1.1, bigChance: 0.005, hot: 1.8},
			{path: "fs", weight: 0.05, minDepth: 1, maxDepth: 2, stop: 0.85, alpha: 3,
				levels:     [][]string{{"ext4", "btrfs", "xfs", "nfs", "nfsd", "cifs", "f2fs", "ocfs2", "proc", "ceph", "fuse", "gfs2", "jbd2", "overlayfs", "ext2", "fat", "udf", "afs", "ubifs", "hfsplus"}},
				langs:      []weighted{{"c", 0.85}, {"h", 0.12}, {"kconfig", 0.03}},
				sizeMedian: 14000, sizeSigma: 1.0, bigChance: 0.01, hot: 1.3},
			{path: "net", weight: 0.05, minDepth: 1, maxDepth: 2, stop: 0.85, alpha: 3,
				levels:     [][]string{{"ipv4", "ipv6", "core", "netfilter", "mac80211", "wireless", "bluetooth", "sched", "sunrpc", "bridge", "tipc", "sctp", "xfrm", "unix", "packet", "mptcp", "smc", "rds"}},
				langs:      []weighted{{"c", 0.9}, {"h", 0.07}, {"kconfig", 0.03}},
				sizeMedian: 14000, sizeSigma: 1.0, bigChance: 0.01, hot: 1.3},
			{path: "sound", weight: 0.04, minDepth: 1, maxDepth: 3, stop: 0.5, alpha: 2,
				levels:     [][]string{{"soc", "pci", "usb", "core", "isa", "drivers", "firewire", "hda", "sparc", "spi"}, {"codecs", "intel", "fsl", "sof", "qcom", "amd"}},
				langs:      []weighted{{"c", 0.85}, {"h", 0.15}},
				sizeMedian: 12000, sizeSigma: 1.0, bigChance: 0.01, hot: 0.8},
			{path: "Documentation", weight: 0.06, minDepth: 0, maxDepth: 3, stop: 0.45, alpha: 3,
				levels: [][]string{{"devicetree", "filesystems", "networking", "admin-guide", "driver-api", "core-api", "translations", "process", "userspace-api", "virt", "arm64", "x86", "power", "trace"},
					{"bindings", "zh_CN", "ja_JP", "it_IT"}},
				langs:      []weighted{{"rst", 0.6}, {"txt", 0.25}, {"yaml", 0.15}},
				sizeMedian: 5000, sizeSigma: 1.0, bigChance: 0.003, hot: 0.7},
			{path: "tools", weight: 0.04, minDepth: 1, maxDepth: 4, stop: 0.45, alpha: 2,
				levels:     [][]string{{"perf", "testing", "lib", "include", "bpf", "power", "arch", "objtool", "scripts", "net"}},
				langs:      []weighted{{"c", 0.6}, {"h", 0.2}, {"py", 0.1}, {"sh", 0.1}},
				sizeMedian: 7000, sizeSigma: 1.1, bigChance: 0.005, hot: 0.9},
			{path: "kernel", weight: 0.008, minDepth: 0, maxDepth: 1, stop: 0.55, alpha: 1.5,
				levels:     [][]string{{"sched", "time", "trace", "bpf", "irq", "locking", "rcu", "events", "cgroup", "power", "printk", "dma", "debug"}},
				langs:      []weighted{{"c", 0.9}, {"h", 0.1}},
				sizeMedian: 16000, sizeSigma: 1.0, bigChance: 0.02, hot: 4},
			{path: "mm", weight: 0.004, minDepth: 0, maxDepth: 1, stop: 0.9, alpha: 1,
				levels: [][]string{{"kasan", "kfence", "damon"}}, langs: []weighted{{"c", 0.95}, {"h", 0.05}},
				sizeMedian: 20000, sizeSigma: 0.9, bigChance: 0.03, hot: 5},
			{path: "lib", weight: 0.006, minDepth: 0, maxDepth: 2, stop: 0.7, alpha: 1,
				levels: [][]string{{"zlib_inflate", "zstd", "xz", "crypto", "raid6", "math", "kunit"}}, langs: []weighted{{"c", 0.9}, {"h", 0.1}},
				sizeMedian: 6000, sizeSigma: 1.0, hot: 1.5},
			{path: "crypto", weight: 0.004, minDepth: 0, maxDepth: 1, stop: 0.9, alpha: 1,
				levels: [][]string{{"asymmetric_keys", "async_tx"}}, langs: []weighted{{"c", 1}},
				sizeMedian: 9000, sizeSigma: 1.0, hot: 1},
			{path: "security", weight: 0.005, minDepth: 1, maxDepth: 2, stop: 0.8, alpha: 1,
				levels: [][]string{{"selinux", "apparmor", "smack", "keys", "integrity", "tomoyo", "landlock"}}, langs: []weighted{{"c", 0.85}, {"h", 0.15}},
				sizeMedian: 12000, sizeSigma: 1.0, hot: 1},
			{path: "scripts", weight: 0.006, minDepth: 0, maxDepth: 2, stop: 0.6, alpha: 1,
				levels: [][]string{{"kconfig", "mod", "dtc", "gdb", "coccinelle", "package"}}, langs: []weighted{{"sh", 0.35}, {"py", 0.2}, {"c", 0.3}, {"make", 0.15}},
				sizeMedian: 5000, sizeSigma: 1.1, hot: 1.5},
			{path: "block", weight: 0.002, minDepth: 0, maxDepth: 1, stop: 0.9, alpha: 1,
				levels: [][]string{{"partitions"}}, langs: []weighted{{"c", 0.9}, {"h", 0.1}},
				sizeMedian: 12000, sizeSigma: 1.0, hot: 3},
			{path: "init", weight: 0.0005, minDepth: 0, maxDepth: 0, langs: []weighted{{"c", 1}}, sizeMedian: 10000, sizeSigma: 0.8, hot: 3},
			{path: "ipc", weight: 0.0005, minDepth: 0, maxDepth: 0, langs: []weighted{{"c", 1}}, sizeMedian: 12000, sizeSigma: 0.8, hot: 1},
			{path: "virt", weight: 0.001, minDepth: 1, maxDepth: 2, stop: 0.7, alpha: 1,
				levels: [][]string{{"kvm", "lib"}}, langs: []weighted{{"c", 0.9}, {"h", 0.1}}, sizeMedian: 15000, sizeSigma: 1.0, hot: 2},
			{path: "samples", weight: 0.003, minDepth: 1, maxDepth: 2, stop: 0.8, alpha: 1.5,
				levels: [][]string{{"bpf", "kprobes", "trace_events", "vfio-mdev", "seccomp"}}, langs: []weighted{{"c", 0.9}, {"make", 0.1}},
				sizeMedian: 4000, sizeSigma: 0.9, hot: 0.5},
		},
		rootFiles: []rootFile{
			{"MAINTAINERS", "txt", 250000, 0.008}, {"Makefile", "make", 60000, 0.004}, {".mailmap", "txt", 15000, 0.0015},
			{"CREDITS", "txt", 95000, 0.0003}, {"README", "txt", 800, 0.0001}, {"COPYING", "txt", 500, 0.00005},
			{"Kconfig", "kconfig", 600, 0.0001}, {"Kbuild", "make", 2000, 0.0002}, {".gitignore", "txt", 1800, 0.0005},
			{".clang-format", "txt", 14000, 0.0001},
		},
		mainTag: func(n int) string {
			if n%8 == 7 {
				return fmt.Sprintf("v%d.%d", 2+n/160, n/8%20)
			}
			return fmt.Sprintf("v%d.%d-rc%d", 2+n/160, n/8%20, n%8+1)
		},
		releaseBranch: func(r int) string { return fmt.Sprintf("linux-%d.%d.y", 4+r, 4+r*5) },
		releaseTag:    func(r, n int) string { return fmt.Sprintf("v%d.%d.%d", 4+r, 4+r*5, n+1) },
	},
}

// Shapes returns the names of the repository shapes Generate knows, sorted.
func Shapes() []string { return []string{"jquery", "linux", "swift"} }
