// Command printversion prints version.String(), for TestLinkedRevision.
package main

import (
	"fmt"

	"github.com/vrdma/vrdma/internal/version"
)

func main() { fmt.Print(version.String()) }
