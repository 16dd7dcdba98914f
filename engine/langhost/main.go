// pulumi-language-python for this project: the engine's language host for a Python program.
//
// The Go module proxy this project builds from refuses Pulumi's own language host module
// (github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3, every version: 403 "This module
// version is not available"), so this is a small one of our own on the SDK's RPC types and its Python
// toolchain package (both in the sdk/v3 module the CLI is built from). It does what `pulumi preview`,
// `up`, `refresh` and `destroy` ask of a language host: it names the resource plugins the virtualenv's
// Pulumi packages declare, and runs the program through the SDK's own executor script
// (pulumi-language-python-exec, installed next to this binary) in the project's virtualenv.
// It does not install dependencies (`make setup` does) and has no debugger or typechecker support.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"

	"github.com/pulumi/pulumi/sdk/v3/go/common/util/rpcutil"
	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
	"github.com/pulumi/pulumi/sdk/v3/python/toolchain"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// version is set at build time (-X main.version=…): the engine shows it in `pulumi about`.
var version = "0.0.0-dev"

// The executor script prints its own message and exits with this code when the user's program
// failed in a way it already explained (pulumi-language-python-exec's convention).
const exitAfterUserMessage = 32

const executorName = "pulumi-language-python-exec"

type host struct {
	pulumirpc.UnimplementedLanguageRuntimeServer
	executor      string
	engineAddress string
}

func main() {
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.String("tracing", "", "ignored: no tracing")
	flag.Parse()
	if *showVersion {
		fmt.Println(version)
		return
	}
	self, err := os.Executable()
	if err != nil {
		fail("cannot find this executable: %v", err)
	}
	executor := filepath.Join(filepath.Dir(self), executorName)
	if _, err := os.Stat(executor); err != nil {
		fail("missing executor %s next to the language host (make engine installs it): %v", executor, err)
	}
	h := &host{executor: executor}
	if flag.NArg() > 0 {
		h.engineAddress = flag.Arg(0)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	cancel := make(chan bool)
	go func() { <-ctx.Done(); close(cancel) }()
	if h.engineAddress != "" {
		// Exit when the engine goes away, as every plugin must.
		if err := rpcutil.Healthcheck(ctx, h.engineAddress, 5*time.Minute, stop); err != nil {
			fail("engine health check: %v", err)
		}
	}
	handle, err := rpcutil.ServeWithOptions(rpcutil.ServeOptions{
		Cancel: cancel,
		Init: func(srv *grpc.Server) error {
			pulumirpc.RegisterLanguageRuntimeServer(srv, h)
			return nil
		},
	})
	if err != nil {
		fail("cannot serve: %v", err)
	}
	fmt.Printf("%d\n", handle.Port) // the engine reads the port from the first line
	if err := <-handle.Done; err != nil {
		fail("stopped serving: %v", err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "pulumi-language-python: "+format+"\n", args...)
	os.Exit(1)
}

func (h *host) Handshake(
	_ context.Context, req *pulumirpc.LanguageHandshakeRequest,
) (*pulumirpc.LanguageHandshakeResponse, error) {
	h.engineAddress = req.GetEngineAddress()
	return &pulumirpc.LanguageHandshakeResponse{}, nil
}

func (h *host) GetPluginInfo(context.Context, *emptypb.Empty) (*pulumirpc.PluginInfo, error) {
	return &pulumirpc.PluginInfo{Version: version}, nil
}

// python resolves the project's toolchain (Pulumi.yaml's runtime options: virtualenv, toolchain).
func python(info *pulumirpc.ProgramInfo) (toolchain.Toolchain, error) {
	opts := toolchain.PythonOptions{
		Root:       info.GetRootDirectory(),
		ProgramDir: info.GetProgramDirectory(),
		Toolchain:  toolchain.Pip,
	}
	options := info.GetOptions().AsMap()
	for key, value := range options {
		switch key {
		case "virtualenv":
			venv, _ := value.(string)
			opts.Virtualenv = venv
		case "toolchain":
			if value != "pip" {
				return nil, fmt.Errorf("runtime option toolchain %q: this language host supports pip only", value)
			}
		default:
			return nil, fmt.Errorf("runtime option %q is not supported by this language host", key)
		}
	}
	if opts.Virtualenv == "" {
		return nil, errors.New("Pulumi.yaml must name the virtualenv (runtime.options.virtualenv)")
	}
	return toolchain.ResolveToolchain(opts)
}

// pluginJSON is what a Pulumi Python package ships to name the plugin it needs.
type pluginJSON struct {
	Resource bool   `json:"resource"`
	Name     string `json:"name"`
	Version  string `json:"version"`
	Server   string `json:"server"`
}

func (h *host) GetRequiredPackages(
	ctx context.Context, req *pulumirpc.GetRequiredPackagesRequest,
) (*pulumirpc.GetRequiredPackagesResponse, error) {
	tc, err := python(req.GetInfo())
	if err != nil {
		return nil, err
	}
	venv, err := tc.VirtualEnvPath(ctx)
	if err != nil {
		return nil, err
	}
	paths, err := filepath.Glob(filepath.Join(venv, "lib", "python*", "site-packages", "*", "pulumi-plugin.json"))
	if err != nil {
		return nil, err
	}
	sort.Strings(paths)
	var packages []*pulumirpc.PackageDependency
	for _, path := range paths {
		raw, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		var p pluginJSON
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if !p.Resource || p.Name == "" {
			continue
		}
		v := p.Version
		if v != "" && v[0] != 'v' {
			v = "v" + v
		}
		packages = append(packages, &pulumirpc.PackageDependency{
			Kind: "resource", Name: p.Name, Version: v, Server: p.Server,
		})
	}
	return &pulumirpc.GetRequiredPackagesResponse{Packages: packages}, nil
}

func (h *host) GetRequiredPlugins(
	context.Context, *pulumirpc.GetRequiredPluginsRequest,
) (*pulumirpc.GetRequiredPluginsResponse, error) {
	return nil, status.Error(codes.Unimplemented, "use GetRequiredPackages")
}

func (h *host) Run(ctx context.Context, req *pulumirpc.RunRequest) (*pulumirpc.RunResponse, error) {
	tc, err := python(req.GetInfo())
	if err != nil {
		return nil, err
	}
	if err := tc.ValidateVenv(ctx); err != nil {
		return nil, err
	}
	args := []string{h.executor}
	add := func(flag, value string) {
		if value != "" {
			args = append(args, "--"+flag, value)
		}
	}
	add("monitor", req.GetMonitorAddress())
	add("engine", h.engineAddress)
	add("project", req.GetProject())
	add("root_directory", req.GetInfo().GetRootDirectory())
	add("stack", req.GetStack())
	add("pwd", req.GetPwd())
	add("dry_run", strconv.FormatBool(req.GetDryRun()))
	add("parallel", strconv.Itoa(int(req.GetParallel())))
	add("organization", req.GetOrganization())
	args = append(args, req.GetInfo().GetEntryPoint())
	args = append(args, req.GetArgs()...)

	config, err := json.Marshal(req.GetConfig())
	if err != nil {
		return nil, err
	}
	secretKeys := req.GetConfigSecretKeys()
	if secretKeys == nil {
		secretKeys = []string{}
	}
	secretJSON, err := json.Marshal(secretKeys)
	if err != nil {
		return nil, err
	}

	cmd, err := tc.Command(ctx, args...)
	if err != nil {
		return nil, err
	}
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, "PULUMI_CONFIG="+string(config), "PULUMI_CONFIG_SECRET_KEYS="+string(secretJSON))
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	// An interrupted update asks the program to stop, then ends it.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 5 * time.Second

	err = cmd.Run()
	if err == nil {
		return &pulumirpc.RunResponse{}, nil
	}
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.ExitStatus() == exitAfterUserMessage {
			return &pulumirpc.RunResponse{Bail: true}, nil
		}
		return &pulumirpc.RunResponse{Error: fmt.Sprintf("program exited with non-zero exit code: %d",
			exitErr.ExitCode())}, nil
	}
	return &pulumirpc.RunResponse{Error: fmt.Sprintf("could not run the program: %v", err)}, nil
}

func (h *host) About(ctx context.Context, req *pulumirpc.AboutRequest) (*pulumirpc.AboutResponse, error) {
	tc, err := python(req.GetInfo())
	if err != nil {
		return nil, err
	}
	info, err := tc.About(ctx)
	if err != nil {
		return nil, err
	}
	return &pulumirpc.AboutResponse{Executable: info.PythonExecutable, Version: info.PythonVersion.String()}, nil
}

func (h *host) GetProgramDependencies(
	ctx context.Context, req *pulumirpc.GetProgramDependenciesRequest,
) (*pulumirpc.GetProgramDependenciesResponse, error) {
	tc, err := python(req.GetInfo())
	if err != nil {
		return nil, err
	}
	deps, err := tc.ListPackages(ctx, req.GetTransitiveDependencies())
	if err != nil {
		return nil, err
	}
	out := make([]*pulumirpc.DependencyInfo, 0, len(deps))
	for _, d := range deps {
		out = append(out, &pulumirpc.DependencyInfo{Name: d.Name, Version: d.Version})
	}
	return &pulumirpc.GetProgramDependenciesResponse{Dependencies: out}, nil
}
