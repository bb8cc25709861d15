//go:build tools

// Package tools pins promtool (checks the chart's PrometheusRule in the
// chart tests).
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
