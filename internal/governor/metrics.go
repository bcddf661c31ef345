package governor

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics are the Prometheus series. Labels are bounded sets (transport,
// service, kind, result): never repo or user, whose cardinality is unbounded.
type Metrics struct {
	registry *prometheus.Registry
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	cpu      *prometheus.CounterVec
	bytes    *prometheus.CounterVec
	relayed  *prometheus.CounterVec
}

func newMetrics() *Metrics {
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "packwire_requests_total", Help: "Git requests by transport, service, kind and result.",
		}, []string{"transport", "service", "kind", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "packwire_request_duration_seconds", Help: "Wall time of git requests.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, []string{"transport", "service", "kind"}),
		cpu: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "packwire_git_cpu_seconds_total", Help: "CPU time of spawned git processes (with the children they waited for).",
		}, []string{"transport", "service", "kind", "mode"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "packwire_bytes_total", Help: "Bytes relayed between clients and git.",
		}, []string{"transport", "service", "kind", "direction"}),
		relayed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "packwire_relayed_requests_total", Help: "Git requests passed on to the cluster node that served them (counted there in packwire_requests_total).",
		}, []string{"transport", "service", "kind", "result"}),
	}
	m.registry.MustRegister(m.requests, m.duration, m.cpu, m.bytes, m.relayed,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *Metrics) observe(r *Record) {
	if r.PackCache == PackCacheRelayed {
		// The serving node counts it: a sum over a cluster's nodes counts
		// each request once.
		m.relayed.WithLabelValues(r.Transport, r.Service, r.Kind, r.Result).Inc()
		return
	}
	m.requests.WithLabelValues(r.Transport, r.Service, r.Kind, r.Result).Inc()
	if r.Result == ResultRefused || r.Result == ResultChallenged {
		return
	}
	m.duration.WithLabelValues(r.Transport, r.Service, r.Kind).Observe(time.Duration(r.Wall).Seconds())
	m.cpu.WithLabelValues(r.Transport, r.Service, r.Kind, "user").Add(time.Duration(r.UserCPU).Seconds())
	m.cpu.WithLabelValues(r.Transport, r.Service, r.Kind, "system").Add(time.Duration(r.SysCPU).Seconds())
	m.bytes.WithLabelValues(r.Transport, r.Service, r.Kind, "in").Add(float64(r.BytesIn))
	m.bytes.WithLabelValues(r.Transport, r.Service, r.Kind, "out").Add(float64(r.BytesOut))
}

// RegisterGauge adds a gauge read at scrape time (requests in flight...).
func (g *Governor) RegisterGauge(name, help string, value func() float64) {
	g.metrics.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, value))
}

// RegisterInfo adds a gauge that is always 1 and says what it says in its
// labels, as Prometheus' *_build_info series do.
func (g *Governor) RegisterInfo(name, help string, labels map[string]string) {
	gauge := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels})
	gauge.Set(1)
	g.metrics.registry.MustRegister(gauge)
}

// MetricsHandler serves the Prometheus text format.
func (g *Governor) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(g.metrics.registry, promhttp.HandlerOpts{})
}
