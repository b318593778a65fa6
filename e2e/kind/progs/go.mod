// Small programs of the kind cluster (e2e/kind), standard library only: the pause program of the
// pod sandboxes, and the runc wrapper that lets privileged containers start on hosts whose
// capability bounding set is smaller than the kernel's list.
module gpunode.local/kindprogs

go 1.26.0
