package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"packwire/internal/datadir"
	"packwire/internal/governor"
	"packwire/internal/lfs"
	"packwire/internal/maintain"
	"packwire/internal/mirror"
	"packwire/internal/repo"
	"packwire/internal/store"
	"packwire/internal/units"
)

const mirrorNote = `Mirror settings live in the repository's own git config (a read-only
mirror: remote.origin.url, packwire.pullMirror, packwire.mirrorInterval; push
mirrors: remote.packwire-push-N.url), credentials in its
packwire-credentials.json (0600): they move with the repository when it is
renamed, deleted and restored, or backed up. A URL's user and password (or
--token) are taken out of the URL, never printed or logged, and given to git
by a credential helper from its environment, so no command line carries
them. URLs: http(s), ssh (the server user's keys), git, file, user@host:path
or a local path. In a cluster (--database with nodes) the settings and
credentials are kept in the database and every node applies them to its
copy; only the repository's primary syncs it and pushes to its push
mirrors.`

// cmdRepoImport creates a repository from a source, as a one-off copy or a
// read-only pull mirror.
func cmdRepoImport(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "repo import NAME SOURCE [--mirror [--interval D]] [--token T | --token-file F] [--no-maintain] [--replicas N] [--data DIR]"
	var o mirror.ImportOptions
	var replicas int
	var noMaintain bool
	var tokenFile string
	data, pos, err := openData(ctx, "repo import", syn, "Create a repository as a copy (all refs) of a local path or URL, and bring it\ninto the serving layout at once (see packwire maintain --help). From an http(s)\nSOURCE it also fetches the LFS objects the history points to, from SOURCE's LFS\nAPI (a failure is a warning: the import stands). With --mirror it\nstays a read-only mirror: the server fetches from SOURCE every --interval (and\npackwire repo sync NAME does at once), pruning refs upstream deleted, and\nrefuses pushes (\"repository 'NAME' is a read-only mirror of URL; push there\ninstead\").\n\n"+mirrorNote, args, stderr,
		func(fs *flag.FlagSet) {
			fs.BoolVar(&noMaintain, "no-maintain", false, "keep the imported object layout as it is (the serve scheduler will still maintain it)")
			fs.IntVar(&replicas, "replicas", 0, "in a cluster (--database with nodes): how many nodes hold it (default min(3, healthy nodes)); its primary imports SOURCE")
			fs.BoolVar(&o.Mirror, "mirror", false, "keep the repository a read-only mirror of SOURCE, synced by the server")
			fs.DurationVar(&o.Interval, "interval", mirror.DefaultInterval, "with --mirror: time between syncs")
			fs.StringVar(&o.Token, "token", "", "authenticate to an http(s) SOURCE with this token (as the password; user x-access-token unless the URL names one)")
			fs.StringVar(&tokenFile, "token-file", "", "read the token from this file's first line (keeps it off the command line)")
		})
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 2, 2, syn); err != nil {
		return err
	}
	if tokenFile != "" {
		if o.Token, err = readFirstLine(tokenFile); err != nil {
			return err
		}
	}
	if clustered, err := inCluster(ctx, data); err != nil || clustered {
		if err != nil {
			return err
		}
		// Checked as on one server (no remote helpers), credentials taken
		// out: a mirror keeps them; a one-off import's are kept in the
		// database until the primary has imported it.
		src, shown, err := mirror.NewPullSpec(pos[1], o.Token, o.Interval)
		if err != nil {
			return fmt.Errorf("repo import %s: %w", pos[0], err)
		}
		source, spec, detail := src.URL, "", "from "+shown
		switch {
		case o.Mirror:
			spec = mirror.Spec{Pull: &src}.Encode()
			detail = fmt.Sprintf("read-only mirror of %s, every %s", shown, src.Interval)
		case !src.Credentials.Empty():
			spec = mirror.Spec{Source: &src.Credentials}.Encode()
		}
		if _, err := placeMirrorInCluster(ctx, data, pos[0], source, spec, replicas, stdout); err != nil {
			return fmt.Errorf("repo import %s: %w", pos[0], err)
		}
		recordRepoChange(ctx, data, stderr, "repo import", pos[0], "placed in the cluster, "+detail)
		return nil
	}
	r, shown, err := mirror.Import(ctx, data.Repos, pos[0], pos[1], o)
	if err != nil {
		return fmt.Errorf("repo import %s: %w", pos[0], err)
	}
	empty := ""
	if refs, err := maintain.New(maintain.Options{}).ReadRefs(ctx, r.Path); err == nil && refs.Branches+refs.Tags+refs.Other == 0 {
		empty = " (empty: the source has no refs yet)"
	}
	if o.Mirror {
		fmt.Fprintf(stdout, "imported %s at %s: a read-only mirror of %s, synced every %s%s\n", r.Name, r.Path, shown, o.Interval, empty)
	} else {
		fmt.Fprintf(stdout, "imported %s from %s at %s%s\n", r.Name, shown, r.Path, empty)
	}
	detail := "from " + shown
	if o.Mirror {
		detail = fmt.Sprintf("read-only mirror of %s, every %s", shown, o.Interval)
	}
	recordRepoChange(ctx, data, stderr, "repo import", r.Name, detail)
	publishRepoCreated(ctx, data, r, shown, o.Mirror, stderr)
	importLFS(ctx, data, r, pos[1], o.Token, shown, stdout, stderr)
	if noMaintain {
		return nil
	}
	if err := maintainImported(ctx, data, r, stdout); err != nil {
		return fmt.Errorf("repo import %s: imported, but bringing it into the serving layout failed (packwire maintain retries): %w", pos[0], err)
	}
	return nil
}

// importLFS fetches, from an http(s) source's LFS API, the LFS objects the
// imported history points to; a failure is a warning (the repository is
// imported; git lfs push from a clone that has them fills the gaps).
func importLFS(ctx context.Context, data *datadir.Data, r repo.Repo, source, token, shown string, stdout, stderr io.Writer) {
	clean, creds, err := mirror.SplitURL(source)
	if err != nil || !strings.HasPrefix(clean, "http://") && !strings.HasPrefix(clean, "https://") {
		return
	}
	if token != "" {
		if creds.Username == "" {
			creds.Username = mirror.DefaultTokenUser
		}
		creds.Password = token
	}
	n, missing, size, err := lfs.FetchObjects(ctx, data.Dir, r.Name, r.Path, clean, creds.Username, creds.Password)
	if n > 0 {
		fmt.Fprintf(stdout, "LFS: fetched %d objects (%d bytes) from %s\n", n, size, shown)
	}
	if missing > 0 {
		fmt.Fprintf(stderr, "packwire: repo import %s: %d LFS objects the history points to are not on %s\n", r.Name, missing, shown)
	}
	if err != nil {
		fmt.Fprintf(stderr, "packwire: repo import %s: imported, but its LFS objects were not all fetched: %v\n", r.Name, err)
	}
}

// cmdRepoSync syncs a pull mirror now, in this process.
func cmdRepoSync(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "repo sync NAME [--data DIR]"
	data, pos, err := openData(ctx, "repo sync", syn, "Sync a pull mirror with its upstream now: fetch everything into a quarantine,\nmove the new objects in, then set every ref to upstream's (new, moved and\ndeleted refs) in one transaction. Recorded in the governor (kind\nmirror-sync: bytes, CPU, wall, result); webhooks and push mirrors hear of the\nrefs it changed. In a cluster (--database with nodes) the repository's\nprimary syncs, asked over the cluster, and its ref transaction is replicated\nas a push's is.", args, stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 1, 1, syn); err != nil {
		return err
	}
	if name, clustered, err := clusterRepo(ctx, data, pos[0]); err != nil || clustered {
		if err != nil {
			return err
		}
		res, err := syncInCluster(ctx, data, name)
		if err != nil {
			return fmt.Errorf("repo sync %s: %w", name, err)
		}
		printSync(stdout, name+" (on its primary, replicated)", res)
		return nil
	}
	r, err := data.Repos.Resolve(pos[0])
	if err != nil {
		return fmt.Errorf("repo sync %s: %w", pos[0], err)
	}
	gov, err := governor.OpenIn(ctx, data.Dir, data.Database)
	if err != nil {
		return err
	}
	gov.Start(governor.Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer gov.Close() // writes the record
	syncer := &mirror.Syncer{Record: gov.Record, Publish: publisher(data).Publish, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	res, err := syncer.Sync(ctx, r, "on demand")
	if err != nil {
		return fmt.Errorf("repo sync %s: %w", r.Name, err)
	}
	printSync(stdout, r.Name, res)
	return nil
}

func cmdRepoMirrorAdd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "repo mirror add NAME URL [--token T | --token-file F] [--data DIR]"
	var token, tokenFile string
	data, pos, err := openData(ctx, "repo mirror add", syn, "Add a push mirror: every push the repository acknowledges is sent on to URL by\nthe running server (git push --mirror: every ref forced to this repository's,\nrefs it no longer has deleted), queued and retried like webhook deliveries\n(10s doubling to 1h, given up after a day); pushes queued while one runs are\nsent by the next. packwire pushes to whatever host URL names.\n\n"+mirrorNote, args, stderr,
		func(fs *flag.FlagSet) {
			fs.StringVar(&token, "token", "", "authenticate to an http(s) URL with this token (as the password; user x-access-token unless the URL names one)")
			fs.StringVar(&tokenFile, "token-file", "", "read the token from this file's first line (keeps it off the command line)")
		})
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 2, 2, syn); err != nil {
		return err
	}
	if tokenFile != "" {
		if token, err = readFirstLine(tokenFile); err != nil {
			return err
		}
	}
	if name, clustered, err := clusterRepo(ctx, data, pos[0]); err != nil || clustered {
		if err != nil {
			return err
		}
		pm, err := addPushInCluster(ctx, data, name, pos[1], token, stdout)
		if err != nil {
			return fmt.Errorf("repo mirror add %s: %w", name, err)
		}
		recordRepoChange(ctx, data, stderr, "repo mirror add", name, fmt.Sprintf("push mirror %d: %s", pm.ID, mirror.Redact(pm.URL)))
		return nil
	}
	r, err := data.Repos.Resolve(pos[0])
	if err != nil {
		return fmt.Errorf("repo mirror add %s: %w", pos[0], err)
	}
	pm, err := mirror.AddPush(ctx, r, pos[1], token)
	if err != nil {
		return fmt.Errorf("repo mirror add %s: %w", r.Name, err)
	}
	recordRepoChange(ctx, data, stderr, "repo mirror add", r.Name, fmt.Sprintf("push mirror %d: %s", pm.ID, mirror.Redact(pm.URL)))
	fmt.Fprintf(stdout, "push mirror %d of %s added: %s%s\n", pm.ID, r.Name, mirror.Redact(pm.URL), credentialsText(r, pm.Remote))
	return nil
}

func cmdRepoMirrorRemove(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "repo mirror remove NAME ID [--data DIR]"
	data, pos, err := openData(ctx, "repo mirror remove", syn, "Remove a push mirror with its credentials; its deliveries still pending are\ngiven up.", args, stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 2, 2, syn); err != nil {
		return err
	}
	id, err := strconv.Atoi(pos[1])
	if err != nil {
		return usagef("repo mirror remove: %q is not a push mirror id (packwire repo mirror list %s)", pos[1], pos[0])
	}
	name, clustered, err := clusterRepo(ctx, data, pos[0])
	if err != nil {
		return err
	}
	var pm mirror.PushMirror
	if clustered {
		pm, err = removePushInCluster(ctx, data, name, id)
	} else {
		var r repo.Repo
		if r, err = data.Repos.Resolve(pos[0]); err != nil {
			return fmt.Errorf("repo mirror remove %s: %w", pos[0], err)
		}
		name = r.Name
		pm, err = mirror.RemovePush(ctx, r, id)
	}
	if err != nil {
		return fmt.Errorf("repo mirror remove: %w", err)
	}
	if err := abandonPushDeliveries(ctx, data, name, id); err != nil {
		return err
	}
	recordRepoChange(ctx, data, stderr, "repo mirror remove", name, fmt.Sprintf("push mirror %d: %s", id, mirror.Redact(pm.URL)))
	fmt.Fprintf(stdout, "push mirror %d of %s removed (%s)\n", id, name, mirror.Redact(pm.URL))
	return nil
}

func cmdRepoMirrorList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "repo mirror list NAME [--data DIR]"
	data, pos, err := openData(ctx, "repo mirror list", syn, "Show a repository's mirroring: the upstream it mirrors (with the last sync) and\nits push mirrors (with their last delivery). URLs are shown without\ncredentials; whether some are stored is said instead.", args, stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 1, 1, syn); err != nil {
		return err
	}
	if name, clustered, err := clusterRepo(ctx, data, pos[0]); err != nil || clustered {
		if err != nil {
			return err
		}
		return listClusterMirrors(ctx, data, name, stdout)
	}
	r, err := data.Repos.Resolve(pos[0])
	if err != nil {
		return fmt.Errorf("repo mirror list %s: %w", pos[0], err)
	}
	cfg, err := mirror.ReadConfig(r)
	if err != nil {
		return err
	}
	return printMirrors(ctx, data, r.Name, cfg, func(remote string) bool { return mirror.HasCredentials(r, remote) },
		func() (mirror.State, error) { return mirror.ReadState(r) }, stdout)
}

// printMirrors shows a repository's mirroring: cfg, whether a remote has
// credentials stored, the pull mirror's last sync, push mirrors' last
// deliveries.
func printMirrors(ctx context.Context, data *datadir.Data, name string, cfg mirror.Config, hasCreds func(remote string) bool, state func() (mirror.State, error), stdout io.Writer) error {
	credsText := func(remote string) string {
		if hasCreds(remote) {
			return " (credentials stored)"
		}
		return ""
	}
	if cfg.IsPullMirror() {
		fmt.Fprintf(stdout, "read-only mirror of %s%s, synced every %s\n", mirror.Redact(cfg.PullURL), credsText(cfg.PullRemote), cfg.Interval)
		st, err := state()
		switch {
		case err != nil:
			fmt.Fprintf(stdout, "  last sync: unreadable (%v)\n", err)
		case st.LastSync.IsZero():
			fmt.Fprintln(stdout, "  last sync: none since the import")
		default:
			fmt.Fprintf(stdout, "  last sync: %s, %s, %d refs changed, %s fetched", st.LastSync.UTC().Format(time.RFC3339), st.Result, st.RefsChanged, units.Bytes(st.Bytes))
			if st.Error != "" {
				fmt.Fprintf(stdout, ": %s", st.Error)
			}
			fmt.Fprintln(stdout)
			if st.Result != governor.ResultOK && !st.LastSuccess.IsZero() {
				fmt.Fprintf(stdout, "  last successful sync: %s\n", st.LastSuccess.UTC().Format(time.RFC3339))
			}
		}
	}
	for _, pm := range cfg.Pushes {
		fmt.Fprintf(stdout, "push mirror %d: %s%s\n", pm.ID, mirror.Redact(pm.URL), credsText(pm.Remote))
		ds, err := data.Store.Deliveries(ctx, store.DeliveryFilter{Kind: store.KindPushMirror, Target: mirror.PushTarget(name, pm.ID), Limit: 1})
		switch {
		case err != nil:
			return err
		case len(ds) == 0:
			fmt.Fprintln(stdout, "  last delivery: none yet")
		default:
			d := ds[0]
			fmt.Fprintf(stdout, "  last delivery: #%d queued %s, %s after %d attempts", d.ID, d.Created.UTC().Format(time.RFC3339), d.State, d.Attempts)
			if d.LastError != "" {
				fmt.Fprintf(stdout, ": %s", d.LastError)
			}
			fmt.Fprintln(stdout)
		}
	}
	if !cfg.IsPullMirror() && len(cfg.Pushes) == 0 {
		fmt.Fprintf(stdout, "%s mirrors nothing and has no push mirrors\n", name)
	}
	return nil
}

// printSync says what a sync did.
func printSync(stdout io.Writer, name string, res mirror.SyncResult) {
	fmt.Fprintf(stdout, "synced %s: %d refs changed, %s fetched, wall %s, git CPU %s\n", name, len(res.Changed), units.Bytes(res.Bytes), ms(res.Wall), ms(res.UserCPU+res.SysCPU))
	for _, u := range res.Changed {
		switch {
		case u.Deleted():
			fmt.Fprintf(stdout, "  - %s (deleted)\n", u.Ref)
		case u.Created():
			fmt.Fprintf(stdout, "  * %s %s (new)\n", u.Ref, u.New[:min(12, len(u.New))])
		default:
			fmt.Fprintf(stdout, "    %s %s..%s\n", u.Ref, u.Old[:min(12, len(u.Old))], u.New[:min(12, len(u.New))])
		}
	}
}

// credentialsText says whether credentials are stored, never what they are.
func credentialsText(r repo.Repo, remote string) string {
	if mirror.HasCredentials(r, remote) {
		return " (credentials stored)"
	}
	return ""
}
