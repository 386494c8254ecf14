"""The Kubernetes side of Anarchon: AnarchonJob/AnarchonRun resources and how the operator reads them."""
