// runc-caps runs the real runc after removing, from the container's OCI spec, every capability this
// host cannot grant. Docker 20.10 gives a privileged container every capability the kernel knows;
// where the host's bounding set lacks one (CAP_SYS_RESOURCE on these machines), runc then fails with
// "unable to apply caps: operation not permitted". kind runs every node privileged, so dockerd uses
// this wrapper as its default runtime (e2e/kind/engine.sh). Only `create`/`run` (the bundle's
// config.json) and `exec` (the --process file) carry capabilities; everything else passes through.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Linux capability numbers (linux/capability.h), in order.
var capNames = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE",
	"CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER",
	"CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT",
	"CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME",
	"CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL",
	"CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM",
	"CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
}

func die(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "runc-caps: "+format+"\n", args...)
	os.Exit(1)
}

// bounding reads this process's capability bounding set: the most any child can hold.
func bounding() map[string]bool {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		die("read /proc/self/status: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if hex, ok := strings.CutPrefix(sc.Text(), "CapBnd:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			if err != nil {
				die("parse CapBnd %q: %v", hex, err)
			}
			allowed := map[string]bool{}
			for i, name := range capNames {
				if mask&(1<<uint(i)) != 0 {
					allowed[name] = true
				}
			}
			return allowed
		}
	}
	die("no CapBnd line in /proc/self/status")
	return nil
}

// filter keeps, in each capability list of caps (bounding, effective, ...), only allowed names.
func filter(caps map[string]any, allowed map[string]bool) {
	for set, v := range caps {
		list, ok := v.([]any)
		if !ok {
			continue
		}
		kept := []any{}
		for _, c := range list {
			if name, ok := c.(string); ok && !allowed[name] {
				continue
			}
			kept = append(kept, c)
		}
		caps[set] = kept
	}
}

// rewrite filters the capabilities found at path (keys) inside the JSON file, in place.
func rewrite(file string, allowed map[string]bool, keys ...string) {
	data, err := os.ReadFile(file)
	if err != nil {
		die("read %s: %v", file, err)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		die("parse %s: %v", file, err)
	}
	node := doc
	for _, k := range keys {
		next, ok := node[k].(map[string]any)
		if !ok {
			return // no capabilities in this spec: nothing to remove
		}
		node = next
	}
	filter(node, allowed)
	out, err := json.Marshal(doc)
	if err != nil {
		die("encode %s: %v", file, err)
	}
	st, err := os.Stat(file)
	if err != nil {
		die("stat %s: %v", file, err)
	}
	if err := os.WriteFile(file, out, st.Mode().Perm()); err != nil {
		die("write %s: %v", file, err)
	}
}

// flagValue returns the value of --name/-short in args ("--name v", "--name=v", "-s v").
func flagValue(args []string, long, short string) (string, bool) {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, long+"="); ok {
			return v, true
		}
		if (a == long || (short != "" && a == short)) && i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}

// Global runc options that take a value (so the command is found after them).
var globalWithValue = map[string]bool{"--root": true, "--log": true, "--log-format": true, "--criu": true, "--rootless": true}

func main() {
	real := os.Getenv("RUNC_CAPS_REAL")
	if real == "" {
		real = "/usr/bin/runc"
	}
	args := os.Args[1:]
	cmd := -1
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			cmd = i
			break
		}
		if globalWithValue[a] {
			i++
		}
	}
	if cmd >= 0 {
		rest := args[cmd+1:]
		switch args[cmd] {
		case "create", "run":
			bundle, ok := flagValue(rest, "--bundle", "-b")
			if !ok {
				bundle = "."
			}
			rewrite(filepath.Join(bundle, "config.json"), bounding(), "process", "capabilities")
		case "exec":
			if p, ok := flagValue(rest, "--process", "-p"); ok {
				rewrite(p, bounding(), "capabilities")
			}
		}
	}
	argv := append([]string{real}, args...)
	if err := syscall.Exec(real, argv, os.Environ()); err != nil {
		die("exec %s: %v", real, err)
	}
}
