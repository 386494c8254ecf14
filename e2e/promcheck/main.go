// promcheck: what `promtool check rules` checks, from Prometheus' own packages, plus the names of
// the metrics each expression reads, so a test can hold them against the operator's /metrics.
//
//	promcheck rules FILE   a rule file (the spec of a PrometheusRule): every group, rule,
//	                       expression, duration, label and annotation template must be valid
//	promcheck exprs        a JSON list of PromQL expressions on stdin (a dashboard's queries)
//
// Prints a JSON list of {"expr", "metrics"}; on any problem prints them to stderr and exits 1.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

type checked struct {
	Expr    string   `json:"expr"`
	Metrics []string `json:"metrics"`
}

func metrics(expr string) ([]string, error) {
	node, err := parser.ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	parser.Inspect(node, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			seen[vs.Name] = true
		}
		return nil
	})
	names := []string{}
	for name := range seen {
		names = append(names, name)
	}
	sort.Strings(names)
	return names, nil
}

func fail(errs ...error) {
	for _, err := range errs {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(1)
}

func main() {
	if len(os.Args) < 2 {
		fail(fmt.Errorf("usage: promcheck rules FILE | promcheck exprs < exprs.json"))
	}
	var exprs []string
	switch os.Args[1] {
	case "rules":
		if len(os.Args) != 3 {
			fail(fmt.Errorf("usage: promcheck rules FILE"))
		}
		groups, errs := rulefmt.ParseFile(os.Args[2], false)
		if len(errs) > 0 {
			fail(errs...)
		}
		for _, group := range groups.Groups {
			for _, rule := range group.Rules {
				exprs = append(exprs, rule.Expr)
			}
		}
	case "exprs":
		data, err := io.ReadAll(os.Stdin)
		if err != nil {
			fail(err)
		}
		if err := json.Unmarshal(data, &exprs); err != nil {
			fail(err)
		}
	default:
		fail(fmt.Errorf("unknown command %q", os.Args[1]))
	}
	out := []checked{}
	var errs []error
	for _, expr := range exprs {
		names, err := metrics(expr)
		if err != nil {
			errs = append(errs, fmt.Errorf("%q: %w", expr, err))
			continue
		}
		out = append(out, checked{expr, names})
	}
	if len(errs) > 0 {
		fail(errs...)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail(err)
	}
}
