package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"packwire/internal/access"
	"packwire/internal/datadir"
	"packwire/internal/mirror"
	"packwire/internal/outbox"
	"packwire/internal/repo"
	"packwire/internal/store"
	"packwire/internal/webhook"
)

const hookNote = `Payloads are queued in the store when a push is acknowledged (the refs the
client's report says were written) or a repository is created, and the
running server POSTs them: Content-Type application/json, X-Packwire-Event,
X-Packwire-Delivery (the same on every attempt) and, with a secret,
X-Packwire-Signature-256: sha256=HEX, the HMAC-SHA256 of the raw body. A 2xx
answer delivers; otherwise the server retries after 10s, doubling up to 1h,
and gives up a day after the event. packwire calls whatever host the URL
names, internal addresses included: only admins can add hooks.`

func cmdHookAdd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "hook add REPO_PATTERN URL [--secret S | --secret-file F] [--events push,ref-delete,repo-create] [--data DIR]"
	var secret, secretFile, events string
	data, pos, err := openData(ctx, "hook add", syn, "Add a webhook: packwire POSTs a JSON payload to URL (http or https) for each\nevent on a repository REPO_PATTERN matches ('*' within a segment, '**' any\ndepth). Events: push (refs created or updated), ref-delete (refs deleted; a\npush that does both sends one payload of each), repo-create.\n\n"+hookNote, args, stderr,
		func(fs *flag.FlagSet) {
			fs.StringVar(&secret, "secret", "", "sign each payload with this secret (never printed back)")
			fs.StringVar(&secretFile, "secret-file", "", "read the secret from this file's first line (keeps it off the command line)")
			fs.StringVar(&events, "events", strings.Join(webhook.AllEvents, ","), "comma-separated events to send")
		})
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 2, 2, syn); err != nil {
		return err
	}
	if err := access.ValidPattern(pos[0]); err != nil {
		return usagef("%v", err)
	}
	if err := webhook.CheckURL(pos[1]); err != nil {
		return usagef("hook URL %s: %v", webhook.RedactURL(pos[1]), err)
	}
	evs, err := webhook.ParseEvents(events)
	if err != nil {
		return usagef("--events: %v", err)
	}
	if secretFile != "" {
		if secret, err = readFirstLine(secretFile); err != nil {
			return err
		}
	}
	id, err := data.Store.AddHook(ctx, store.Hook{RepoPattern: pos[0], URL: pos[1], Secret: secret, Events: evs})
	if err != nil {
		return fmt.Errorf("hook add: %w", err)
	}
	fmt.Fprintf(stdout, "hook %d added: %s -> %s, events %s, %s\n", id, pos[0], webhook.RedactURL(pos[1]), strings.Join(evs, ","), secretText(secret))
	return nil
}

func secretText(secret string) string {
	if secret == "" {
		return "no secret (payloads unsigned)"
	}
	return "secret set"
}

// readFirstLine reads a secret or token from a file.
func readFirstLine(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	line = strings.TrimSpace(line)
	if line == "" {
		return "", fmt.Errorf("%s: empty", path)
	}
	return line, nil
}

func cmdHookList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var asJSON bool
	const syn = "hook list [--json] [--data DIR]"
	data, pos, err := openData(ctx, "hook list", syn, "List webhooks: id, repository pattern, URL (without user, password or query),\nevents, whether a secret is set (never the secret).", args, stderr,
		func(fs *flag.FlagSet) { fs.BoolVar(&asJSON, "json", false, "machine-readable output") })
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 0, 0, syn); err != nil {
		return err
	}
	hooks, err := data.Store.Hooks(ctx)
	if err != nil {
		return err
	}
	if asJSON {
		type hookJSON struct {
			ID          int64     `json:"id"`
			RepoPattern string    `json:"repo_pattern"`
			URL         string    `json:"url"`
			Events      []string  `json:"events"`
			Secret      bool      `json:"secret"`
			Created     time.Time `json:"created"`
		}
		out := []hookJSON{}
		for _, h := range hooks {
			out = append(out, hookJSON{h.ID, h.RepoPattern, webhook.RedactURL(h.URL), h.Events, h.Secret != "", h.Created.UTC()})
		}
		return writeJSON(stdout, out)
	}
	if len(hooks) == 0 {
		fmt.Fprintln(stdout, "no webhooks (packwire hook add PATTERN URL)")
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPATTERN\tURL\tEVENTS\tSECRET")
	for _, h := range hooks {
		secret := "none"
		if h.Secret != "" {
			secret = "set"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", h.ID, h.RepoPattern, webhook.RedactURL(h.URL), strings.Join(h.Events, ","), secret)
	}
	return tw.Flush()
}

func cmdHookRemove(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "hook remove ID [--data DIR]"
	data, pos, err := openData(ctx, "hook remove", syn, "Remove a webhook. Its deliveries still pending are given up; the others stay\nlisted until they age out (7 days).", args, stderr, nil)
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 1, 1, syn); err != nil {
		return err
	}
	id, err := strconv.ParseInt(pos[0], 10, 64)
	if err != nil {
		return usagef("hook remove: %q is not a hook id (packwire hook list)", pos[0])
	}
	if err := data.Store.RemoveHook(ctx, id); err != nil {
		return fmt.Errorf("hook remove: %w", err)
	}
	fmt.Fprintf(stdout, "hook %d removed\n", id)
	return nil
}

func cmdHookDeliveries(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var asJSON bool
	var last int
	const syn = "hook deliveries [ID] [--last N] [--json] [--data DIR]"
	data, pos, err := openData(ctx, "hook deliveries", syn, "List the newest webhook deliveries (of hook ID, or of every hook): event,\nrepository, state (pending, delivered, failed), attempts, and the last\nattempt's HTTP status, latency and error; --json adds every attempt and the\npayload.", args, stderr,
		func(fs *flag.FlagSet) {
			fs.BoolVar(&asJSON, "json", false, "machine-readable output, with every attempt and the payload")
			fs.IntVar(&last, "last", 20, "list this many deliveries")
		})
	if err != nil {
		return err
	}
	defer data.Close()
	if err := wantArgs(args, pos, 0, 1, syn); err != nil {
		return err
	}
	f := store.DeliveryFilter{Kind: store.KindWebhook, Limit: last}
	if len(pos) == 1 {
		id, err := strconv.ParseInt(pos[0], 10, 64)
		if err != nil {
			return usagef("hook deliveries: %q is not a hook id", pos[0])
		}
		f.Target = strconv.FormatInt(id, 10)
	}
	ds, err := data.Store.Deliveries(ctx, f)
	if err != nil {
		return err
	}
	return printDeliveries(ctx, data.Store, stdout, ds, asJSON)
}

// printDeliveries lists deliveries for hook deliveries and repo mirror list.
func printDeliveries(ctx context.Context, st *store.Store, out io.Writer, ds []store.Delivery, asJSON bool) error {
	if asJSON {
		type deliveryJSON struct {
			store.Delivery
			Payload  json.RawMessage `json:"payload"`
			Attempts []store.Attempt `json:"attempt_log"`
		}
		list := []deliveryJSON{}
		for _, d := range ds {
			as, err := st.Attempts(ctx, d.ID)
			if err != nil {
				return err
			}
			if as == nil {
				as = []store.Attempt{}
			}
			list = append(list, deliveryJSON{Delivery: d, Payload: json.RawMessage(d.Payload), Attempts: as})
		}
		return writeJSON(out, list)
	}
	if len(ds) == 0 {
		fmt.Fprintln(out, "no deliveries")
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tQUEUED\tTARGET\tEVENT\tREPO\tSTATE\tATTEMPTS\tLAST")
	for _, d := range ds {
		state := d.State
		if d.State == store.DeliveryPending && d.Attempts > 0 {
			state += " (retry " + d.NextAttempt.UTC().Format("15:04:05") + ")"
		}
		lastAttempt := "-"
		if d.Attempts > 0 {
			lastAttempt = ms(d.LastLatency)
			if d.LastStatus != 0 {
				lastAttempt = fmt.Sprintf("HTTP %d %s", d.LastStatus, lastAttempt)
			}
		}
		if d.LastError != "" {
			lastAttempt += " " + d.LastError
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", d.ID, d.Created.UTC().Format("2006-01-02 15:04:05"), d.Target, d.Event, d.Repo, state, d.Attempts, lastAttempt)
	}
	return tw.Flush()
}

// publisher queues events from the command line; the running server's
// delivery loop finds them when it next polls its queue.
func publisher(data *datadir.Data) *outbox.Publisher {
	return &outbox.Publisher{Store: data.Store, Sources: []outbox.Source{webhook.Source(data.Store), mirror.Source(data.Repos)}}
}

// publishRepoCreated queues the repo-create webhooks of a new repository.
// The repository exists whatever happens here: a failure is a warning.
func publishRepoCreated(ctx context.Context, data *datadir.Data, r repo.Repo, source string, isMirror bool, stderr io.Writer) {
	ev := outbox.Event{Type: outbox.RepoCreated, Repo: r.Name, Transport: "cli", Source: source, Mirror: isMirror}
	if err := publisher(data).Publish(ctx, ev); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(stderr, "packwire: warning: repo-create webhooks not queued: %v\n", err)
	}
}
