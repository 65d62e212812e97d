#include "guest/steer.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

namespace trybox::guest {
namespace {

// ---- a minimal BPF assembler: the instructions this program needs, nothing more ----------

bpf_insn Insn(uint8_t code, uint8_t dst, uint8_t src, int16_t off, int32_t imm) {
  bpf_insn i{};
  i.code = code;
  i.dst_reg = dst & 0xf;
  i.src_reg = src & 0xf;
  i.off = off;
  i.imm = imm;
  return i;
}

class Program {
 public:
  void MovReg(int dst, int src) { Add(Insn(BPF_ALU64 | BPF_MOV | BPF_X, dst, src, 0, 0)); }
  void MovImm(int dst, int32_t imm) { Add(Insn(BPF_ALU64 | BPF_MOV | BPF_K, dst, 0, 0, imm)); }
  void AddImm(int dst, int32_t imm) { Add(Insn(BPF_ALU64 | BPF_ADD | BPF_K, dst, 0, 0, imm)); }
  void AndImm(int dst, int32_t imm) { Add(Insn(BPF_ALU64 | BPF_AND | BPF_K, dst, 0, 0, imm)); }
  void LoadW(int dst, int src, int16_t off) {
    Add(Insn(BPF_LDX | BPF_MEM | BPF_W, dst, src, off, 0));
  }
  void StoreImmW(int dst, int16_t off, int32_t imm) {
    Add(Insn(BPF_ST | BPF_MEM | BPF_W, dst, 0, off, imm));
  }
  // *(u64 *)(dst + off) += src, atomically.
  void AtomicAddDW(int dst, int src, int16_t off) {
    Add(Insn(BPF_STX | BPF_ATOMIC | BPF_DW, dst, src, off, BPF_ADD));
  }
  void LoadMapFd(int dst, int fd) {
    Add(Insn(BPF_LD | BPF_DW | BPF_IMM, dst, BPF_PSEUDO_MAP_FD, 0, fd));
    Add(Insn(0, 0, 0, 0, 0));
  }
  void Call(int32_t helper) { Add(Insn(BPF_JMP | BPF_CALL, 0, 0, 0, helper)); }
  void Exit() { Add(Insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0)); }
  // Conditional and plain jumps to a label, resolved by Finish.
  void JumpIf(uint8_t op, int dst, int32_t imm, int label) {
    Jump(Insn(BPF_JMP | op | BPF_K, dst, 0, 0, imm), label);
  }
  void Goto(int label) { Jump(Insn(BPF_JMP | BPF_JA, 0, 0, 0, 0), label); }
  int NewLabel() {
    labels_.push_back(-1);
    return static_cast<int>(labels_.size()) - 1;
  }
  void Bind(int label) { labels_[label] = static_cast<int>(code_.size()); }

  std::vector<bpf_insn> Finish() {
    for (const auto& [at, label] : fixups_) {
      code_[at].off = static_cast<int16_t>(labels_[label] - at - 1);
    }
    return code_;
  }

 private:
  void Add(bpf_insn i) { code_.push_back(i); }
  void Jump(bpf_insn i, int label) {
    fixups_.emplace_back(static_cast<int>(code_.size()), label);
    Add(i);
  }
  std::vector<bpf_insn> code_;
  std::vector<int> labels_;
  std::vector<std::pair<int, int>> fixups_;
};

enum Reg { R0 = 0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10 };
constexpr int32_t kSkPass = 1;

constexpr int32_t kTcpSlot = 0;
constexpr int32_t kUdpSlot = 1;

// ctx: struct bpf_sk_lookup. r6 keeps it across calls; r7 the socket from the map.
std::vector<bpf_insn> SteeringProgram(int sockmap_fd) {
  Program p;
  const int pass = p.NewLabel(), assign = p.NewLabel();
  p.MovReg(R6, R1);
  p.LoadW(R2, R6, offsetof(bpf_sk_lookup, family));
  p.JumpIf(BPF_JNE, R2, AF_INET, pass);
  // local_ip4 is in network byte order: its first octet is the low byte of the load.
  p.LoadW(R3, R6, offsetof(bpf_sk_lookup, local_ip4));
  p.AndImm(R3, 0xff);
  p.JumpIf(BPF_JEQ, R3, 127, pass);
  p.LoadW(R2, R6, offsetof(bpf_sk_lookup, protocol));
  // TCP to slot 0 (the listener), UDP to slot 1 (the sink that counts and discards).
  p.StoreImmW(R10, -4, kTcpSlot);
  p.JumpIf(BPF_JEQ, R2, IPPROTO_TCP, assign);
  p.JumpIf(BPF_JNE, R2, IPPROTO_UDP, pass);
  p.StoreImmW(R10, -4, kUdpSlot);
  p.Bind(assign);
  p.LoadMapFd(R1, sockmap_fd);
  p.MovReg(R2, R10);
  p.AddImm(R2, -4);
  p.Call(BPF_FUNC_map_lookup_elem);
  p.JumpIf(BPF_JEQ, R0, 0, pass);  // no socket there: the normal lookup refuses it
  p.MovReg(R7, R0);
  p.MovReg(R1, R6);
  p.MovReg(R2, R7);
  p.MovImm(R3, 0);
  p.Call(BPF_FUNC_sk_assign);
  p.MovReg(R1, R7);
  p.Call(BPF_FUNC_sk_release);
  p.Bind(pass);
  p.MovImm(R0, kSkPass);
  p.Exit();
  return p.Finish();
}

long Bpf(int cmd, bpf_attr* attr) { return ::syscall(SYS_bpf, cmd, attr, sizeof *attr); }

Status PutSocket(int map, uint32_t slot, int fd, const char* what) {
  bpf_attr a{};
  uint64_t value = static_cast<uint64_t>(fd);
  a.map_fd = static_cast<uint32_t>(map);
  a.key = reinterpret_cast<uint64_t>(&slot);
  a.value = reinterpret_cast<uint64_t>(&value);
  a.flags = BPF_ANY;
  if (Bpf(BPF_MAP_UPDATE_ELEM, &a) != 0) {
    return ErrnoError(std::string("bpf: put the ") + what + " in the socket map");
  }
  return Status::Ok();
}

// ---- rtnetlink: one request, one acknowledgement ------------------------------------------

Status NetlinkRequest(const void* msg, size_t len, const std::string& what) {
  UniqueFd s(::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE));
  if (!s.valid()) return ErrnoError(what + ": netlink socket");
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(s.get(), msg, len, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) < 0) {
    return ErrnoError(what + ": send");
  }
  alignas(nlmsghdr) char buf[4096];
  ssize_t n;
  do {
    n = ::recv(s.get(), buf, sizeof buf, 0);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoError(what + ": receive");
  auto* h = reinterpret_cast<nlmsghdr*>(buf);
  if (!NLMSG_OK(h, static_cast<unsigned>(n)) || h->nlmsg_type != NLMSG_ERROR) {
    return Internal(what + ": the kernel's answer is not an acknowledgement");
  }
  int err = -static_cast<nlmsgerr*>(NLMSG_DATA(h))->error;
  if (err != 0 && err != EEXIST) return ErrnoError(what, err);
  return Status::Ok();
}

}  // namespace

Status AddLocalDefaultRoute() {
  unsigned lo = ::if_nametoindex("lo");
  if (lo == 0) return ErrnoError("route: no lo interface");
  struct {
    nlmsghdr h;
    rtmsg r;
    alignas(NLMSG_ALIGNTO) char attrs[64];
  } req{};
  req.h.nlmsg_type = RTM_NEWROUTE;
  req.h.nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
  req.h.nlmsg_seq = 1;
  req.r.rtm_family = AF_INET;
  req.r.rtm_dst_len = 0;
  req.r.rtm_table = RT_TABLE_MAIN;
  req.r.rtm_protocol = RTPROT_BOOT;
  req.r.rtm_scope = RT_SCOPE_HOST;
  req.r.rtm_type = RTN_LOCAL;
  auto* attr = reinterpret_cast<rtattr*>(req.attrs);
  attr->rta_type = RTA_OIF;
  attr->rta_len = RTA_LENGTH(sizeof(uint32_t));
  uint32_t oif = lo;
  std::memcpy(RTA_DATA(attr), &oif, sizeof oif);
  req.h.nlmsg_len = NLMSG_LENGTH(sizeof(rtmsg)) + RTA_ALIGN(attr->rta_len);
  return NetlinkRequest(&req, req.h.nlmsg_len, "route: add local 0.0.0.0/0 dev lo");
}

std::string Ipv4Text(uint32_t host_order) {
  in_addr a{htonl(host_order)};
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a, buf, sizeof buf);
  return buf;
}

Status AskForDestinations(int udp_sink) {
  int one = 1;
  if (::setsockopt(udp_sink, IPPROTO_IP, IP_RECVORIGDSTADDR, &one, sizeof one) != 0) {
    return ErrnoError("setsockopt IP_RECVORIGDSTADDR");
  }
  return Status::Ok();
}

Result<std::string> ReceiveSteered(int udp_sink, int flags) {
  char data[2048];
  alignas(cmsghdr) char control[256];
  iovec iov{data, sizeof data};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = ::recvmsg(udp_sink, &mh, flags);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoError("recvmsg");
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_ORIGDSTADDR) {
      sockaddr_in o{};
      std::memcpy(&o, CMSG_DATA(c), sizeof o);
      return Ipv4Text(ntohl(o.sin_addr.s_addr)) + ":" + std::to_string(ntohs(o.sin_port));
    }
  }
  return std::string("unknown");
}

Result<Steering> Steering::Install(int tcp_listener, int udp_sink) {
  RETURN_IF_ERROR(AddLocalDefaultRoute());
  Steering s;
  bpf_attr m{};
  m.map_type = BPF_MAP_TYPE_SOCKMAP;
  m.key_size = sizeof(uint32_t);
  m.value_size = sizeof(uint64_t);
  m.max_entries = 2;
  long map = Bpf(BPF_MAP_CREATE, &m);
  if (map < 0) return ErrnoError("bpf: create the socket map");
  s.sockmap_.Reset(static_cast<int>(map));
  RETURN_IF_ERROR(PutSocket(s.sockmap_.get(), kTcpSlot, tcp_listener, "TCP listener"));
  RETURN_IF_ERROR(PutSocket(s.sockmap_.get(), kUdpSlot, udp_sink, "UDP sink"));
  std::vector<bpf_insn> code = SteeringProgram(s.sockmap_.get());
  std::string log(16384, '\0');
  static const char kLicense[] = "Dual MIT/GPL";
  bpf_attr a{};
  a.prog_type = BPF_PROG_TYPE_SK_LOOKUP;
  a.expected_attach_type = BPF_SK_LOOKUP;
  a.insns = reinterpret_cast<uint64_t>(code.data());
  a.insn_cnt = static_cast<uint32_t>(code.size());
  a.license = reinterpret_cast<uint64_t>(kLicense);
  a.log_buf = reinterpret_cast<uint64_t>(log.data());
  a.log_size = static_cast<uint32_t>(log.size());
  a.log_level = 1;
  std::strncpy(a.prog_name, "trybox_steer", sizeof a.prog_name - 1);
  long prog = Bpf(BPF_PROG_LOAD, &a);
  if (prog < 0) {
    int err = errno;
    log.resize(std::strlen(log.c_str()));
    if (log.size() > 600) log = "..." + log.substr(log.size() - 600);
    return ErrnoError("bpf: load the steering program" + (log.empty() ? "" : " (" + log + ")"),
                      err);
  }
  s.prog_.Reset(static_cast<int>(prog));
  UniqueFd netns(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
  if (!netns.valid()) return ErrnoError("open /proc/thread-self/ns/net");
  bpf_attr l{};
  l.link_create.prog_fd = static_cast<uint32_t>(s.prog_.get());
  l.link_create.target_fd = static_cast<uint32_t>(netns.get());
  l.link_create.attach_type = BPF_SK_LOOKUP;
  long link = Bpf(BPF_LINK_CREATE, &l);
  if (link < 0) return ErrnoError("bpf: attach the steering program to the network namespace");
  s.link_.Reset(static_cast<int>(link));
  return s;
}

}  // namespace trybox::guest
