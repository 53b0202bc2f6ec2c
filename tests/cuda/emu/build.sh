# Sourced by the emulate.sh scripts. emu_build UNIT... compiles each unit with g++ $F (at most
# $EMU_JOBS at a time, default 2) and links $D/check. A unit is a name (the rewritten source
# $D/NAME.cc) or a path (a source used as it is).
emu_build() {
  local objs=() src obj
  for src in "$@"; do
    obj="$D/$(basename "${src%.*}").o"
    [[ "$src" == */* ]] || src="$D/$src.cc"
    g++ $F -c "$src" -o "$obj" &
    objs+=("$obj")
    if [ "$(jobs -rp | wc -l)" -ge "${EMU_JOBS:-2}" ]; then wait -n; fi
  done
  wait
  g++ $F "${objs[@]}" -o "$D/check" -pthread -ldl  # -ldl: dlopen (emu_fibers.h) before glibc 2.34
}
