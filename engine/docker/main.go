// pulumi-resource-docker for this project's engine tier: kreuzwerker's Terraform Docker provider served
// to the Pulumi engine by the Terraform bridge, under the name and version pulumi-docker==5.2.0's
// Python SDK registers its resources with (docker, 5.2.0). pulumi-docker 5.2.0 wraps the Terraform
// provider's v4.6.0; the module proxy serves the nearest later commit (engine/build.sh pins it).
//
// Pulumi's own provider modules (github.com/pulumi/pulumi-docker/provider/v4 and /v5, every version)
// are refused by the Go module proxy (403 "This module version is not available"); the Terraform
// provider they wrap and the bridge are served. This file maps the resources the program uses to the SDK's type tokens and
// property names; pulumi-docker's native `Image` (BuildKit builds) is not among them: it is Pulumi's own
// Go code, in the refused module (README, "The engine").
package main

import (
	"github.com/pulumi/pulumi-terraform-bridge/v3/pkg/tfbridge"
	shimv2 "github.com/pulumi/pulumi-terraform-bridge/v3/pkg/tfshim/sdk-v2"
	"github.com/pulumi/pulumi/sdk/v3/go/common/tokens"
	"github.com/terraform-providers/terraform-provider-docker/shim"
)

// The Python SDK's package name and version: the engine looks the plugin up by these.
const (
	pkg     = "docker"
	version = "5.2.0"
)

func token(kind, name string) tokens.Type { return tokens.Type(pkg + ":index/" + kind + ":" + name) }

func main() {
	info := tfbridge.ProviderInfo{
		P:       shimv2.NewProvider(shim.NewProvider(version)),
		Name:    pkg,
		Version: version,
		Config: map[string]*tfbridge.SchemaInfo{
			// The SDK's name for the provider's registry credentials (a list, not pluralized).
			"registry_auth": {Name: "registryAuth"},
		},
		Resources: map[string]*tfbridge.ResourceInfo{
			"docker_container": {
				Tok: token("container", "Container"),
				Fields: map[string]*tfbridge.SchemaInfo{
					// The SDK keeps these two names as Terraform spells them.
					"command":           {Name: "command"},
					"networks_advanced": {Name: "networksAdvanced"},
				},
			},
			"docker_volume":  {Tok: token("volume", "Volume")},
			"docker_network": {Tok: token("network", "Network")},
			"docker_tag":     {Tok: token("tag", "Tag")},
		},
	}
	// No schema: the engine asks for one only for code generation, never during preview, up or refresh.
	tfbridge.Main(pkg, version, info, []byte("{}"))
}
