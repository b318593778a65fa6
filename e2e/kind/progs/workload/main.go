// workload stands in for a training job in the kind e2e suite, and checks the pod network:
//
//	workload [-drain D]   runs until SIGTERM, says so, keeps running for D (checkpointing, say)
//	                      and exits 0; a drain that honours the pod's grace period lets it finish
//	workload -serve ADDR  the same, answering HTTP on ADDR with its hostname
//	workload -get URL     fetches URL once (names resolved through the pod's DNS), prints the body
//	                      and exits: 0 on a 200, 1 otherwise
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	drain := flag.Duration("drain", 2*time.Second, "how long it keeps running after SIGTERM")
	serve := flag.String("serve", "", "answer HTTP on this address with the hostname")
	get := flag.String("get", "", "fetch this URL once and exit")
	flag.Parse()
	host, _ := os.Hostname()
	if *get != "" {
		os.Exit(fetch(*get))
	}
	if *serve != "" {
		http.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, host) })
		go func() {
			if err := http.ListenAndServe(*serve, nil); err != nil {
				fmt.Fprintf(os.Stderr, "workload %s: serve %s: %v\n", host, *serve, err)
				os.Exit(1)
			}
		}()
	}
	fmt.Printf("workload %s: running\n", host)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	s := <-sigs
	start := time.Now()
	fmt.Printf("workload %s: got %v, finishing for %v\n", host, s, *drain)
	time.Sleep(*drain) // the work a job does before it can stop (not a test wait)
	fmt.Printf("workload %s: finished cleanly after %v\n", host, time.Since(start).Round(time.Millisecond))
}

// fetch GETs url until it answers 200 or 30 s pass: a Service's rules reach each node's
// kube-proxy a moment after its endpoints exist, and until then a connection is refused.
func fetch(url string) int {
	deadline := time.Now().Add(30 * time.Second)
	for {
		code := fetchOnce(url)
		if code == 0 || time.Now().After(deadline) {
			return code
		}
		time.Sleep(500 * time.Millisecond) // retry interval
	}
}

func fetchOnce(url string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		fmt.Fprintf(os.Stderr, "get %s: %v\n", url, err)
		return 1
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintf(os.Stderr, "get %s: %v\n", url, err)
		return 1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Printf("%s", body)
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(os.Stderr, "get %s: %s\n", url, resp.Status)
		return 1
	}
	return 0
}
