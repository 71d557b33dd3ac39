package devcerts_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/intentd/intentd/internal/run/devcerts"
)

// A CA, a server certificate for loopback and intentd.internal, one client
// certificate for the principal ops-1, and the two certificates a test
// expects intentd to refuse.
func ExampleGenerate() {
	dir, err := os.MkdirTemp("", "devcerts-example-")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	files, err := devcerts.Generate(dir, devcerts.Options{
		Hosts:           []string{"intentd.internal"},
		Clients:         []string{"ops-1"},
		ExpiredClient:   "ops-1",
		UntrustedClient: "ops-1",
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("server names:", files.ServerNames)
	fmt.Println("client:", filepath.Base(files.Clients["ops-1"].Cert), devcerts.PrincipalURI("ops-1"))
	fmt.Println("tests:", filepath.Base(files.Expired.Cert), filepath.Base(files.Untrusted.Cert))
	// Output:
	// server names: [localhost intentd.internal 127.0.0.1 ::1]
	// client: client-ops-1.pem intentd://principal/ops-1
	// tests: client-expired.pem client-untrusted.pem
}
