package synth

import (
	"math/rand/v2"
	"slices"
	"strconv"
)

// fileText is the content of one version of a file, kept compact: a list
// of line seeds rendered on demand into code-like text in the file's
// language with the file's own identifiers. A new version copies the seeds
// and changes a few hunks, so versions share most lines (packs delta them
// like source code) and the text repeats its identifiers and keywords (it
// compresses like source code).
type fileText struct {
	lang   *language
	vocab  uint64   // seed of the file's identifiers
	lines  []uint32 // line seeds
	target int      // line count edits drift towards
}

// language renders lines of one kind of file.
type language struct {
	ext       string
	snake     bool   // snake_case identifiers (C, shell, Python) or camelCase
	indent    string // one level of indentation
	lineLen   int    // average rendered line length, measured
	exec      bool   // scripts get mode 100755
	templates []string
}

// Template placeholders: {i} indentation, {v} one of the file's
// identifiers, {T} one of its type names, {g} a common word, {W} an upper
// case word, {n} a number, {x} a hex number, {s} a few words of prose.
var languages = map[string]*language{
	"c": {ext: ".c", snake: true, indent: "\t", lineLen: 26, templates: []string{
		"{i}{v} = {v}({v}, {n});", "{i}{v} = {v}({v}, {n});", "{i}{v}->{v} = {v};", "{i}{v}->{v} = {v};",
		"{i}if ({v}->{v} < {n})", "{i}if (!{v})", "{i}\treturn -E{W};", "{i}struct {v} *{v} = {v}->{v};",
		"{i}/* {s} */", "static int {v}(struct {v} *{v}, unsigned int {v})", "{", "}", "}", "{i}}", "{i}}", "", "", "",
		"#include <linux/{g}.h>", "#define {W}_{W}\t{x}", "{i}for ({v} = 0; {v} < {v}; {v}++) {",
		"{i}{v}({v}, {x});", "{i}spin_lock(&{v}->{g}_lock);", "{i}spin_unlock(&{v}->{g}_lock);", "{i}return {v};",
		"{i}return 0;", "{i}case {W}_{W}:", "{i}break;", "{i}goto out_{g};", "out_{g}:", "{i}u32 {v};", "{i}int {v}, {v};",
		" * {s}", " * {s}", "/**", " */", "{i}dev_err(&{v}->dev, \"{s}\\n\");", "EXPORT_SYMBOL_GPL({v});",
	}},
	"h": {ext: ".h", snake: true, indent: "\t", lineLen: 24, templates: []string{
		"#define {W}_{W}\t{x}", "#define {W}_{W}\t{x}", "#define {W}_{W}({v})\t(({v}) << {n})", "struct {v} {", "};", "",
		"{i}u32 {v};", "{i}struct {v} *{v};", "{i}unsigned long {v};", "{i}int (*{v})(struct {v} *{v});",
		"int {v}(struct {v} *{v}, int {v});", "void {v}(struct {v} *{v});", "/* {s} */", "#include <linux/{g}.h>",
		"static inline int {v}(struct {v} *{v})", "{", "{i}return {v}->{v};", "}", " * {s}", "#endif /* {W}_{W}_H */",
	}},
	"asm": {ext: ".S", snake: true, indent: "\t", lineLen: 20, templates: []string{
		"{i}movq %r{g}, {n}(%rsp)", "{i}mov {v}, %eax", "{i}call {v}", "{i}jmp .L{v}", ".L{v}:", "SYM_FUNC_START({v})",
		"SYM_FUNC_END({v})", "{i}ret", "/* {s} */", "#include <asm/{g}.h>", "",
	}},
	"dts": {ext: ".dts", snake: true, indent: "\t", lineLen: 24, templates: []string{
		"{i}{v}: {g}@{x} {", "{i}compatible = \"{g},{v}\";", "{i}reg = <{x} {x}>;", "{i}status = \"okay\";",
		"{i}interrupts = <{n} {n}>;", "{i}clocks = <&{v} {n}>;", "{i}};", "", "/* {s} */", "#include \"{v}.dtsi\"",
	}},
	"kconfig": {ext: "", snake: true, indent: "\t", lineLen: 22, templates: []string{
		"config {W}_{W}", "{i}tristate \"{s}\"", "{i}bool \"{s}\"", "{i}depends on {W}_{W}", "{i}select {W}", "{i}help",
		"{i}  {s}.", "{i}  {s}.", "", "if {W}", "endif", "source \"{g}/{v}/Kconfig\"",
	}},
	"make": {ext: "", snake: true, indent: "\t", lineLen: 28, templates: []string{
		"obj-$(CONFIG_{W}_{W}) += {v}.o", "obj-$(CONFIG_{W}_{W}) += {v}.o", "{v}-y := {v}.o {v}.o", "{v}-objs += {v}.o",
		"ccflags-y += -I$(src)/{g}", "# {s}", "", "{W}_{W} := {n}", "{v}: {v}.o", "{i}$(Q)$(MAKE) {v}={g}",
	}},
	"js": {ext: ".js", indent: "\t", lineLen: 30, templates: []string{
		"{i}var {v} = {v}.{v}( {v}, \"{g}\" );", "{i}var {v} = {v}.{v}( {v}, \"{g}\" );", "{i}if ( {v}.{v} ) {",
		"{i}} else {", "{i}}", "{i}}", "{i}} );", "{i}return {v};", "{i}return {v}.{v}( {v} );", "{i}// {s}", "{i}// {s}",
		"{i}{v}: function( {v}, {v} ) {", "jQuery.fn.{v} = function( {v} ) {", "{i}{v}[ {v} ] = {v}.{v}( {v} );",
		"{i}QUnit.test( \"{s}\", function( assert ) {", "{i}assert.equal( {v}.{v}, {n}, \"{s}\" );",
		"{i}assert.ok( {v}, \"{s}\" );", "", "", "{i}for ( {v} = 0; {v} < {v}.length; {v}++ ) {",
		"{i}jQuery.each( {v}, function( {v}, {v} ) {", "define( [ \"./{g}\", \"./{v}\" ], function( {v} ) {",
	}},
	"html": {ext: ".html", indent: "\t", lineLen: 36, templates: []string{
		"{i}<div id=\"{v}\" class=\"{g}\">{s}</div>", "{i}<div id=\"{v}\" class=\"{g}\">", "{i}</div>",
		"{i}<span class=\"{v}\">{s}</span>", "{i}<p>{s}</p>", "{i}<script src=\"../{g}/{v}.js\"></script>",
		"{i}<input type=\"{g}\" name=\"{v}\" value=\"{n}\">", "{i}<li id=\"{v}\">{s}</li>", "",
	}},
	"css": {ext: ".css", indent: "\t", lineLen: 20, templates: []string{
		"#{v} .{g} {", "{i}{g}: {n}px;", "{i}{g}: {n}px;", "{i}color: #{x};", "}", "", ".{v}, .{v} {", "/* {s} */",
	}},
	"json": {ext: ".json", indent: "\t", lineLen: 22, templates: []string{
		"{i}\"{v}\": \"{g}\",", "{i}\"{v}\": \"{g}\",", "{i}\"{v}\": {n},", "{i}\"{v}\": {", "{i}},", "{i}\"{v}\": [ \"{g}\", \"{g}\" ],",
	}},
	"php": {ext: ".php", indent: "\t", lineLen: 26, templates: []string{
		"{i}${v} = $_REQUEST['{v}'];", "{i}echo ${v};", "{i}if ( isset( ${v} ) ) {", "{i}}", "<?php", "{i}// {s}", "",
	}},
	"xml": {ext: ".xml", indent: "  ", lineLen: 30, templates: []string{
		"{i}<{g} id=\"{v}\">{s}</{g}>", "{i}<{v} value=\"{n}\"/>", "{i}<{g}>", "{i}</{g}>", "",
	}},
	"swift": {ext: ".swift", indent: "  ", lineLen: 30, templates: []string{
		"{i}func {v}(_ {v}: {T}) -> {T} {", "{i}let {v} = {v}.{v}({v})", "{i}let {v} = {v}.{v}({v})", "{i}var {v}: {T} = {n}",
		"{i}// CHECK: {g} {v} : ${T}", "{i}// CHECK-LABEL: sil hidden @{v}", "// RUN: %target-swift-frontend -emit-{g} %s | %FileCheck %s",
		"{i}}", "{i}}", "{i}return {v}", "{i}guard let {v} = {v} else { return nil }", "public struct {T} {", "import {T}",
		"{i}/// {s}", "", "", "{i}if {v} < {n} {", "{i}{v}.{v}({v}: {v})", "extension {T} : {T} {", "{i}case {v}({T})",
	}},
	"sil": {ext: ".sil", indent: "  ", lineLen: 34, templates: []string{
		"sil @{v} : $@convention(thin) ({T}) -> {T} {", "bb{n}(%{n} : ${T}):", "{i}%{n} = apply %{n}(%{n}) : $@convention(thin) () -> ()",
		"{i}%{n} = struct_extract %{n} : ${T}, #{T}.{v}", "{i}return %{n} : ${T}", "}", "", "// CHECK: {g} %{n}",
	}},
	"cpp": {ext: ".cpp", indent: "  ", lineLen: 30, templates: []string{
		"{i}auto *{v} = {v}->get{T}();", "{i}auto *{v} = {v}->get{T}();", "void {T}::{v}({T} &{v}) {", "{i}if (!{v})",
		"{i}  return {v};", "#include \"swift/{T}/{T}.h\"", "{i}// {s}", "{i}// {s}", "{i}}", "{i}}", "{i}{v}.push_back({v});",
		"{i}llvm::SmallVector<{T} *, {n}> {v};", "", "", "{i}for (auto *{v} : {v}->get{T}s()) {", "{i}return {v}->{v}({v});",
		"{i}assert({v} && \"{s}\");", "{i}switch ({v}->getKind()) {", "{i}case {T}Kind::{T}:", "//===--- {T}.cpp - {s} ---===//",
	}},
	"def": {ext: ".def", indent: "  ", lineLen: 26, templates: []string{
		"{T}({T}, {T})", "{T}({T}, {T})", "ABSTRACT_{W}({T}, {T})", "#ifndef {W}", "#define {W}(Id, Parent)", "#endif", "// {s}", "",
	}},
	"cmake": {ext: ".txt", indent: "  ", lineLen: 28, templates: []string{
		"add_swift_host_library({T} STATIC", "{i}{T}.cpp", "{i}{T}.cpp", "{i}{T}.cpp", ")", "set({W}_{W} {g})",
		"if({W}_{W})", "endif()", "# {s}", "", "target_link_libraries({T} PRIVATE {T})",
	}},
	"py": {ext: ".py", snake: true, indent: "    ", lineLen: 28, exec: true, templates: []string{
		"{i}def {v}({v}, {v}):", "{i}return {v}.{v}({v})", "{i}{v} = {v}[{n}]", "{i}{v} = {v}.{v}({v}, {v})", "import {g}",
		"{i}# {s}", "{i}if {v} is not None:", "{i}for {v} in {v}:", "", "", "class {T}(object):", "{i}\"\"\"{s}\"\"\"",
	}},
	"sh": {ext: ".sh", snake: true, indent: "  ", lineLen: 24, exec: true, templates: []string{
		"{i}{v}=\"${{W}}\"", "{i}if [ -z \"${v}\" ]; then", "{i}fi", "{i}echo \"{s}\"", "{i}{v} \"${v}\" {g}", "# {s}", "",
		"{i}for {v} in ${v}; do", "{i}done", "{v}() {", "}",
	}},
	"md": {ext: ".md", indent: "  ", lineLen: 44, templates: []string{
		"{s} {s}.", "{s} {s}.", "{s}, {s} {s}.", "## {T} {g}", "- {s}", "- {s}", "", "", "`{v}` {s}.",
	}},
	"rst": {ext: ".rst", indent: "   ", lineLen: 44, templates: []string{
		"{s} {s}.", "{s} {s}.", "{s}, {s} {s}.", "{T} {g}", "========", "- {s}", "", "", "``{v}`` {s}.", ".. {g}:: {v}",
	}},
	"yaml": {ext: ".yaml", indent: "  ", lineLen: 24, templates: []string{
		"{i}{v}:", "{i}{v}: {g}", "{i}  - {g},{v}", "{i}description: {s}", "{i}maxItems: {n}", "",
	}},
	"txt": {ext: ".txt", indent: "\t", lineLen: 40, templates: []string{
		"{s} {s}.", "{T} {T} <{g}@{g}.org>", "{i}{s}", "{W}: {s}", "", "{s} {s} {s}.",
	}},
}

var words = []string{
	"buffer", "count", "node", "queue", "state", "index", "value", "entry", "device", "handle", "event", "data",
	"list", "size", "flag", "lock", "table", "page", "cache", "stream", "token", "scope", "type", "expr", "decl",
	"module", "frame", "slot", "map", "key", "path", "name", "result", "error", "context", "config", "option",
	"request", "response", "element", "selector", "style", "attr", "prop", "callback", "handler", "timer",
	"deferred", "promise", "ready", "width", "height", "offset", "parent", "child", "sibling", "text", "html",
	"class", "port", "addr", "irq", "dma", "reg", "mask", "bits", "phy", "link", "mode", "clock", "power", "reset",
	"init", "probe", "remove", "open", "close", "read", "write", "start", "stop", "alloc", "free", "get", "put",
	"set", "clear", "update", "check", "parse", "emit", "visit", "lower", "build", "load", "store", "copy", "move",
	"match", "find", "insert", "delete", "apply", "resolve", "reject", "pending", "active", "target", "source",
	"local", "global", "inner", "outer", "first", "last", "next", "prev", "head", "tail", "root", "leaf", "block",
	"range", "limit", "depth", "level", "format", "input", "output", "header", "body", "field", "member", "owner",
	"generic", "closure", "protocol", "witness", "thunk", "layout", "metadata", "runtime", "array", "string",
	"the", "a", "to", "of", "when", "is", "not", "and", "for", "with", "on", "this", "that", "after", "before",
}

// fileVocab is a file's own identifiers, derived from its vocab seed.
type fileVocab struct {
	idents [16]string
	types  [6]string
}

func (fv *fileVocab) init(seed uint64, snake bool) {
	r := lineRand{seed}
	for i := range fv.idents {
		a, b := words[r.n(len(words)-20)], words[r.n(len(words)-20)]
		switch {
		case i%4 == 3:
			fv.idents[i] = a
		case snake:
			fv.idents[i] = a + "_" + b
		default:
			fv.idents[i] = a + upperFirst(b)
		}
	}
	for i := range fv.types {
		fv.types[i] = upperFirst(words[r.n(len(words)-20)]) + upperFirst(words[r.n(len(words)-20)])
	}
}

func upperFirst(s string) string {
	if s == "" || s[0] < 'a' || s[0] > 'z' {
		return s
	}
	return string(s[0]-'a'+'A') + s[1:]
}

// lineRand is splitmix64: tiny, fast and good enough to render text.
type lineRand struct{ s uint64 }

func (r *lineRand) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	return mix64(r.s)
}

func (r *lineRand) n(k int) int { return int(r.next() % uint64(k)) }

func mix64(z uint64) uint64 {
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// render appends the file's text to buf.
func (t *fileText) render(buf []byte) []byte {
	var fv fileVocab
	fv.init(t.vocab, t.lang.snake)
	for _, seed := range t.lines {
		r := lineRand{t.vocab ^ uint64(seed)*0x9e3779b97f4a7c15}
		tpl := t.lang.templates[r.n(len(t.lang.templates))]
		buf = expand(buf, tpl, &r, &fv, t.lang)
		buf = append(buf, '\n')
	}
	return buf
}

func expand(buf []byte, tpl string, r *lineRand, fv *fileVocab, lang *language) []byte {
	for i := 0; i < len(tpl); i++ {
		c := tpl[i]
		if c != '{' || i+2 >= len(tpl) || tpl[i+2] != '}' {
			buf = append(buf, c)
			continue
		}
		switch tpl[i+1] {
		case 'i':
			depth := [...]int{0, 1, 1, 1, 2, 2, 3, 1}[r.n(8)]
			for range depth {
				buf = append(buf, lang.indent...)
			}
		case 'v':
			if r.n(10) < 8 {
				buf = append(buf, fv.idents[r.n(len(fv.idents))]...)
			} else {
				buf = append(buf, words[r.n(len(words)-20)]...)
			}
		case 'T':
			buf = append(buf, fv.types[r.n(len(fv.types))]...)
		case 'g':
			buf = append(buf, words[r.n(len(words)-20)]...)
		case 'W':
			for _, b := range []byte(words[r.n(len(words)-20)]) {
				buf = append(buf, b-'a'+'A')
			}
		case 'n':
			buf = strconv.AppendInt(buf, int64(r.n(1000)), 10)
		case 'x':
			buf = append(buf, "0x"...)
			buf = strconv.AppendUint(buf, r.next()&0xffff, 16)
		case 's':
			n := 3 + r.n(6)
			for j := range n {
				if j > 0 {
					buf = append(buf, ' ')
				}
				buf = append(buf, words[r.n(len(words))]...)
			}
		default:
			buf = append(buf, tpl[i:i+3]...)
		}
		i += 2
	}
	return buf
}

// newText makes the first version of a file of about size bytes.
func newText(lang *language, size int, rng *rand.Rand, nextLine func() uint32) *fileText {
	n := max(1, size/lang.lineLen)
	t := &fileText{lang: lang, vocab: rng.Uint64(), lines: make([]uint32, n), target: n}
	for i := range t.lines {
		t.lines[i] = nextLine()
	}
	return t
}

// edit returns the next version of a file: one to six hunks (two on
// average, of about five lines) replaced, inserted or deleted, drifting
// towards the file's target length; now and then a larger rewrite, as
// refactorings do.
func (t *fileText) edit(rng *rand.Rand, nextLine func() uint32) *fileText {
	lines := slices.Clone(t.lines)
	fresh := func(n int) []uint32 { return freshLines(n, nextLine) }
	hunks := 1 + min(5, geometric(rng, 1))
	if rng.Float64() < 0.02 && len(lines) > 10 {
		// A rewrite of a fifth to two fifths of the file.
		n := len(lines) * (20 + rng.IntN(21)) / 100
		at := rng.IntN(len(lines) - n + 1)
		lines = slices.Replace(lines, at, at+n, fresh(n)...)
	}
	for range hunks {
		at := rng.IntN(len(lines) + 1)
		grow := 0.25
		if len(lines) < t.target {
			grow = 0.4
		} else if len(lines) > t.target*5/4 {
			grow = 0.1
		}
		r := rng.Float64()
		switch {
		case r < 0.5 && at < len(lines): // replace
			n := min(1+rng.IntN(6), len(lines)-at)
			lines = slices.Replace(lines, at, at+n, fresh(1+rng.IntN(8))...)
		case r < 0.5+grow || len(lines) < 4: // insert
			lines = slices.Insert(lines, at, fresh(1+rng.IntN(10))...)
		default: // delete
			at = min(at, len(lines)-1)
			n := min(1+rng.IntN(5), len(lines)-at, len(lines)-1)
			lines = slices.Delete(lines, at, at+n)
		}
	}
	return &fileText{lang: t.lang, vocab: t.vocab, lines: lines, target: t.target}
}

// freshLines returns n new line seeds.
func freshLines(n int, nextLine func() uint32) []uint32 {
	s := make([]uint32, n)
	for i := range s {
		s[i] = nextLine()
	}
	return s
}
