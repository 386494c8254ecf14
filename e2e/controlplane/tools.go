//go:build tools

// Package tools pins the commands that build.sh builds, so that `go mod tidy`
// keeps their whole dependency graph in go.mod/go.sum. It is never compiled.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
