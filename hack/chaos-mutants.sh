#!/usr/bin/env bash
# make chaos-mutants: applies each seeded bug under test/chaos/mutants/ to a
# temporary copy of the repository and runs the chaos suite (a short budget)
# plus the mutant's targeted tests there (ginkgo suites stop at their first
# failure). Every mutant must be caught (some test fails); a mutant that
# survives is a finding, and this exits 1.
# Results: .chaos/mutants/<name>.result and the table .chaos/mutants.md
# (what docs/reliability.md records); logs in .chaos/mutants/<name>.log.
#
#   hack/chaos-mutants.sh [mutant-name-substring]
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${ROOT}/.chaos/mutants"
mkdir -p "${OUT}"
BUDGET="${CHAOS_MUTANT_BUDGET:-45s}"
filter="${1:-}"
survivors=0
cd "${ROOT}"
for patch in test/chaos/mutants/*.patch; do
	name="$(basename "${patch}" .patch)"
	[[ -n "${filter}" && "${name}" != *"${filter}"* ]] && continue
	what="$(sed -n '1s/^# //p' "${patch}")"
	targets="$(sed -n 's/^# targets: //p' "${patch}")"
	tmp="$(mktemp -d)"
	# The committed tree: edits in progress never leak into a mutant.
	git archive HEAD | tar -xf - -C "${tmp}"
	if ! (cd "${tmp}" && patch -s -p1 <"${ROOT}/${patch}"); then
		echo "chaos-mutants: ${name} does not apply any more; update it" >&2
		rm -rf "${tmp}"
		exit 2
	fi
	echo ">> mutant ${name}: ${what}"
	log="${OUT}/${name}.log"
	: >"${log}"
	caught=()
	for pkg in ${targets} ./test/chaos; do
		args=()
		if grep -qs 'onsi/ginkgo' "${tmp}/${pkg#./}"/*_test.go; then
			args=(-args -ginkgo.fail-fast)
		fi
		echo "=== ${pkg}" >>"${log}"
		if (cd "${tmp}" && KUBEBUILDER_ASSETS="${ROOT}/bin" CHAOS_BUDGET="${BUDGET}" \
			go test -count=1 -timeout 12m "${pkg}" "${args[@]}" >>"${log}" 2>&1); then
			echo "   ${pkg}: passed (did not catch it)"
		else
			echo "   ${pkg}: FAILED (caught it)"
			caught+=("${pkg#./}")
		fi
	done
	rm -rf "${tmp}"
	if ((${#caught[@]} == 0)); then
		survivors=$((survivors + 1))
		echo "| ${name} | ${what} | **nothing: survived** |" >"${OUT}/${name}.result"
	else
		echo "| ${name} | ${what} | $(IFS=,; echo "${caught[*]}" | sed 's/,/, /g') |" >"${OUT}/${name}.result"
	fi
done
{
	echo "| mutant | what it breaks | caught by (packages that failed) |"
	echo "|---|---|---|"
	cat "${OUT}"/*.result 2>/dev/null
} >"${ROOT}/.chaos/mutants.md"
echo ">> results in .chaos/mutants.md"
cat "${ROOT}/.chaos/mutants.md"
if ((survivors > 0)); then
	echo "chaos-mutants: ${survivors} mutant(s) survived: each is a finding (a safety mechanism no test checks)" >&2
	exit 1
fi
