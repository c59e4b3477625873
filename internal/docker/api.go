package docker

// The wire format of libnetwork's remote NetworkDriver and IpamDriver
// (docker/libnetwork drivers/remote/api and ipams/remote/api, as the
// 20.10 engine speaks them). Field names are the JSON keys; unknown fields
// in requests are ignored.

// activateResponse answers Plugin.Activate.
type activateResponse struct {
	Implements []string
}

// --- NetworkDriver ---

type capabilitiesResponse struct {
	Scope             string
	ConnectivityScope string
}

// ipamData is libnetwork's driverapi.IPAMData as it marshals it: CIDR
// strings, AuxAddresses keyed by the user's name for them.
type ipamData struct {
	AddressSpace string
	Pool         string
	Gateway      string
	AuxAddresses map[string]string
}

type createNetworkRequest struct {
	NetworkID string
	Options   map[string]any
	IPv4Data  []ipamData
	IPv6Data  []ipamData
}

type networkRequest struct {
	NetworkID string
}

type allocateNetworkRequest struct {
	NetworkID string
	Options   map[string]string
	IPv4Data  []ipamData
	IPv6Data  []ipamData
}

type allocateNetworkResponse struct {
	Options map[string]string
}

type endpointInterface struct {
	Address     string `json:",omitempty"`
	AddressIPv6 string `json:",omitempty"`
	MacAddress  string `json:",omitempty"`
}

type createEndpointRequest struct {
	NetworkID  string
	EndpointID string
	Interface  *endpointInterface
	Options    map[string]any
}

type createEndpointResponse struct {
	Interface *endpointInterface `json:",omitempty"`
}

type endpointRequest struct {
	NetworkID  string
	EndpointID string
}

type endpointInfoResponse struct {
	Value map[string]any
}

type joinRequest struct {
	NetworkID  string
	EndpointID string
	SandboxKey string
	Options    map[string]any
}

type interfaceName struct {
	SrcName   string
	DstPrefix string
}

// Route types of libnetwork's types.StaticRoute.
const (
	routeNextHop   = 0
	routeConnected = 1
)

type staticRoute struct {
	Destination string
	RouteType   int
	NextHop     string `json:",omitempty"`
}

type joinResponse struct {
	InterfaceName         *interfaceName
	Gateway               string        `json:",omitempty"`
	GatewayIPv6           string        `json:",omitempty"`
	StaticRoutes          []staticRoute `json:",omitempty"`
	DisableGatewayService bool
}

type discoveryNotification struct {
	DiscoveryType int
	DiscoveryData any
}

// --- IpamDriver ---

type ipamCapabilitiesResponse struct {
	RequiresMACAddress    bool
	RequiresRequestReplay bool
}

type addressSpacesResponse struct {
	LocalDefaultAddressSpace  string
	GlobalDefaultAddressSpace string
}

type requestPoolRequest struct {
	AddressSpace string
	Pool         string
	SubPool      string
	Options      map[string]string
	V6           bool
}

type requestPoolResponse struct {
	PoolID string
	Pool   string
	Data   map[string]string
}

type releasePoolRequest struct {
	PoolID string
}

type requestAddressRequest struct {
	PoolID  string
	Address string
	Options map[string]string
}

type requestAddressResponse struct {
	Address string
	Data    map[string]string
}

type releaseAddressRequest struct {
	PoolID  string
	Address string
}

// errorResponse is every error reply, with HTTP 500. The plugin client
// reads Err from non-200 replies for both driver kinds; Error is what the
// IPAM client reads from 200 replies, set too for tools that look there.
type errorResponse struct {
	Err   string
	Error string
}

// Option and value names libnetwork uses.
const (
	optGeneric         = "com.docker.network.generic"
	optRequestAddrType = "RequestAddressType"
	addrTypeGateway    = "com.docker.network.gateway"
)
