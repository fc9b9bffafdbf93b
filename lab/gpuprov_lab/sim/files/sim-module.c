/* {label}: the modinfo of one simulated NVIDIA kernel module (no code). */
#define SIM_INFO(tag, text) \
  static const char __sim_##tag[] __attribute__((section(".modinfo"), used, aligned(1))) = text
SIM_INFO(version, "version=" SIM_VERSION);
SIM_INFO(license, "license=" SIM_LICENSE);
SIM_INFO(description, "description=NVIDIA kernel module, " "{label}");
SIM_INFO(simulated, "simulated=gpuprov lab");
SIM_INFO(name, "name=" SIM_NAME);
SIM_INFO(vermagic, "vermagic=" SIM_VERMAGIC);
