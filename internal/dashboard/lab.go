package dashboard

import (
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path"
	"sort"
	"strings"
	"time"
)

// ReportFile is what every run directory of the lab holds.
const ReportFile = "report.html"

// labTypes are the files of a run the dashboard serves, by extension.
var labTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".json": "application/json",
	".csv":  "text/csv; charset=utf-8",
	".txt":  "text/plain; charset=utf-8",
	".svg":  "image/svg+xml",
	".png":  "image/png",
}

type labView struct {
	Dir     string
	Missing bool // the directory does not exist (yet)
	Runs    []labRun
}

type labRun struct {
	Name     string
	Modified time.Time
	Size     int64
	Files    []string // besides report.html
}

// validName is one path segment made of the characters run names use;
// never "." or "..", never hidden.
func validName(s string) bool {
	if s == "" || len(s) > 200 || s[0] == '.' {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func (h *Handler) lab(w http.ResponseWriter, r *http.Request, who string) {
	v := labView{Dir: h.LabDir}
	root, err := os.OpenRoot(h.LabDir)
	if errors.Is(err, fs.ErrNotExist) || h.LabDir == "" {
		v.Missing = true
		h.render(w, "lab", page{Title: "Lab", Nav: "lab", User: who, Data: v})
		return
	}
	if err != nil {
		h.fail(w, who, http.StatusInternalServerError, "cannot open the lab directory", err)
		return
	}
	defer root.Close()
	entries, err := fs.ReadDir(root.FS(), ".")
	if err != nil {
		h.fail(w, who, http.StatusInternalServerError, "cannot list the lab directory", err)
		return
	}
	for _, e := range entries {
		if !validName(e.Name()) {
			continue
		}
		fi, err := root.Stat(e.Name() + "/" + ReportFile)
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		run := labRun{Name: e.Name(), Modified: fi.ModTime(), Size: fi.Size()}
		if files, err := fs.ReadDir(root.FS(), e.Name()); err == nil {
			for _, f := range files {
				if f.Name() != ReportFile && validName(f.Name()) && labTypes[path.Ext(f.Name())] != "" && f.Type().IsRegular() {
					run.Files = append(run.Files, f.Name())
				}
			}
		}
		v.Runs = append(v.Runs, run)
	}
	sort.SliceStable(v.Runs, func(i, j int) bool { return v.Runs[i].Modified.After(v.Runs[j].Modified) })
	h.render(w, "lab", page{Title: "Lab", Nav: "lab", User: who, Data: v})
}

// labFile serves one file of a run, NAME/FILE, in place: confined to the
// lab directory (no "..", no symlink out of it), only the known types, and
// under a CSP that lets a report show its inline CSS and SVG and nothing else.
func (h *Handler) labFile(w http.ResponseWriter, r *http.Request, rel string) {
	run, file, ok := strings.Cut(rel, "/")
	ctype := labTypes[path.Ext(file)]
	if !ok || !validName(run) || !validName(file) || ctype == "" || h.LabDir == "" {
		h.notFound(w, r)
		return
	}
	root, err := os.OpenRoot(h.LabDir)
	if err != nil {
		h.notFound(w, r)
		return
	}
	defer root.Close()
	f, err := root.Open(run + "/" + file)
	if err != nil {
		h.notFound(w, r)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		h.notFound(w, r)
		return
	}
	w.Header().Set("Content-Security-Policy", reportCSP)
	w.Header().Set("Content-Type", ctype)
	w.Header().Set("Cache-Control", "no-cache")
	http.ServeContent(w, r, file, fi.ModTime(), f)
}
